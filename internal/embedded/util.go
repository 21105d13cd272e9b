package embedded

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CheckBinaries reports whether the PostgreSQL server binaries are
// installed: nil when they are, an error wrapping ErrNoBinaries (saying
// where it looked) when they are not.
func CheckBinaries() error {
	_, err := findBinaries(0)
	return err
}

// Dir is the cluster's directory: it holds pgdata (the data directory) and
// postgres.log.
func (c *Cluster) Dir() string { return c.dir }

// Version is the version of the binaries that serve the cluster, as pg_ctl
// --version prints it (e.g. "15.20").
func (c *Cluster) Version() string { return c.bin.version }

// StopImmediate aborts the attached server without a checkpoint, like a
// crash (SIGQUIT to the postmaster; the next start runs crash recovery), and
// waits until it has exited; if it lingers StartTimeout, it is killed.
func (pm *Postmaster) StopImmediate() error {
	defer pm.log.Close()
	if err := kill(pm.proc); err != nil {
		return fmt.Errorf("signal postmaster: %w", err)
	}
	t := time.NewTimer(StartTimeout)
	defer t.Stop()
	select {
	case <-pm.done:
		return nil
	case <-t.C:
		_ = pm.proc.Kill()
		<-pm.done
		return fmt.Errorf("postgres did not exit within %s of an immediate shutdown", StartTimeout)
	}
}

// IntInFile reads the number on the first line of a file (0 if none): a
// port file, a pid file.
func IntInFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}
