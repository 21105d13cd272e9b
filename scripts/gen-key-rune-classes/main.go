// Command gen-key-rune-classes prints the rows of pgoutbox.key_rune_classes
// (migration 00008): the code point ranges that Go's credential-key guard
// (pgoutbox.IsCredentialKey) treats as upper-case letters (U), lower-case
// letters (L) and other letters or digits (O), as Go's unicode package of the
// running toolchain defines them. Every code point outside the ranges
// separates words.
//
// The migration holds the output for Unicode 15.0.0 (Go 1.21 and later);
// TestKeyRuneClassesMatchGo fails when the toolchain's tables differ, and a
// new migration must then replace the rows.
package main

import (
	"fmt"
	"os"
	"strings"
	"unicode"
)

// class is splitWords' view of a rune (effect.go).
func class(r rune) byte {
	switch {
	case !unicode.IsLetter(r) && !unicode.IsDigit(r):
		return 'S'
	case unicode.IsUpper(r):
		return 'U'
	case unicode.IsLower(r):
		return 'L'
	}
	return 'O'
}

func main() {
	var rows []string
	lo, prev := rune(0), class(0)
	for r := rune(1); r <= unicode.MaxRune+1; r++ {
		c := byte('S')
		if r <= unicode.MaxRune {
			c = class(r)
		}
		if c == prev {
			continue
		}
		if prev != 'S' {
			rows = append(rows, fmt.Sprintf("(%d,%d,'%c')", lo, r-1, prev))
		}
		lo, prev = r, c
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- Unicode %s: %d ranges (scripts/gen-key-rune-classes).\n", unicode.Version, len(rows))
	b.WriteString("INSERT INTO pgoutbox.key_rune_classes (lo, hi, class) VALUES\n")
	for i, r := range rows {
		if i%8 == 0 {
			b.WriteString("    ")
		}
		b.WriteString(r)
		switch {
		case i == len(rows)-1:
			b.WriteString(";\n")
		case i%8 == 7:
			b.WriteString(",\n")
		default:
			b.WriteString(",")
		}
	}
	os.Stdout.WriteString(b.String())
}
