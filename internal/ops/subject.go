package ops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// subjectMaxLen bounds a subject's text values (runes); longer ones are cut
// and end in "…".
const subjectMaxLen = 200

// Subject names what an effect is about, read from a fixed set of payload
// keys (store.SubjectKeys): the projection's record, the control plane's
// repository, release run, execution attempt and workflow run. Nothing else
// of the payload is ever read for it, so a listing shows what failed and
// never payload content. Empty fields are absent from the payload (or not a
// string or a number there).
type Subject struct {
	RecordID           string `json:"record_id,omitempty"`
	Repository         string `json:"repository,omitempty"`
	ReleaseRunID       int64  `json:"release_run_id,omitempty"`
	ExecutionAttemptID int64  `json:"execution_attempt_id,omitempty"`
	AttemptNumber      int64  `json:"attempt_number,omitempty"`
	WorkflowRunID      int64  `json:"workflow_run_id,omitempty"`
}

// ParseSubject reads a Subject from a JSON payload (or from the object
// store.SubjectSQL builds). Text fields take a string or a number as
// written; id fields take an integer or a string of one; anything else,
// and any payload that is not a JSON object, leaves the field empty.
func ParseSubject(payload []byte) Subject {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(payload, &m); err != nil {
		return Subject{}
	}
	text := func(k string) string {
		raw := bytes.TrimSpace(m[k])
		var s string
		switch {
		case len(raw) == 0:
			return ""
		case raw[0] == '"':
			if json.Unmarshal(raw, &s) != nil {
				return ""
			}
		case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
			s = string(raw)
		default:
			return ""
		}
		if utf8.RuneCountInString(s) > subjectMaxLen {
			s = string([]rune(s)[:subjectMaxLen-1]) + "…"
		}
		return s
	}
	id := func(k string) int64 {
		n, err := strconv.ParseInt(text(k), 10, 64)
		if err != nil {
			return 0
		}
		return n
	}
	return Subject{
		RecordID: text("record_id"), Repository: text("repository"),
		ReleaseRunID: id("release_run_id"), ExecutionAttemptID: id("execution_attempt_id"),
		AttemptNumber: id("attempt_number"), WorkflowRunID: id("workflow_run_id"),
	}
}

// String is the subject on one line, e.g. "record c17" or
// "acme/api release run 12 attempt 34 (#2)"; "-" when empty.
func (s Subject) String() string {
	var parts []string
	if s.RecordID != "" {
		parts = append(parts, "record "+s.RecordID)
	}
	if s.Repository != "" {
		parts = append(parts, s.Repository)
	}
	if s.ReleaseRunID != 0 {
		parts = append(parts, fmt.Sprintf("release run %d", s.ReleaseRunID))
	}
	switch {
	case s.ExecutionAttemptID != 0 && s.AttemptNumber != 0:
		parts = append(parts, fmt.Sprintf("attempt %d (#%d)", s.ExecutionAttemptID, s.AttemptNumber))
	case s.ExecutionAttemptID != 0:
		parts = append(parts, fmt.Sprintf("attempt %d", s.ExecutionAttemptID))
	case s.AttemptNumber != 0:
		parts = append(parts, fmt.Sprintf("attempt #%d", s.AttemptNumber))
	}
	if s.WorkflowRunID != 0 {
		parts = append(parts, fmt.Sprintf("workflow run %d", s.WorkflowRunID))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
