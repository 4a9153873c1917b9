package policy

import (
	"strconv"
	"strings"
)

// Error is one problem found in a policy.
type Error struct {
	// File is the path Load read or the name given to Parse.
	File string
	// Line is the 1-based line of the offending node; 0 when unknown.
	Line int
	// Domain is the domain being read; "" before it is known.
	Domain string
	// Field is the path of the offending field, e.g.
	// "descriptors[0].rate_limit.unit"; "" for the document as a whole.
	Field string
	// Problem says what is wrong and, where it helps, how to fix it.
	Problem string
}

// Error formats e as `file:line: domain "d": field: problem`, leaving out the
// parts that are unknown.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Domain != "" {
		b.WriteString("domain ")
		b.WriteString(strconv.Quote(e.Domain))
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// ErrorList is every problem found in one Parse or Load, in document order.
// Parse and Load return one (as error) whenever they fail.
type ErrorList []*Error

// Error joins the errors, one per line.
func (l ErrorList) Error() string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

// Unwrap returns the errors, for errors.As and errors.Is.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}
