package config

import (
	"fmt"
	"strings"
)

// FieldError is one problem with one configuration key.
type FieldError struct {
	// Key is the full key path: "sandbox.memory", "network.deny[2]",
	// "sandbox.pool.python".
	Key string
	// Message says what is wrong, without the key.
	Message string
	// Source says where the offending value came from: "FILE:LINE" (or
	// "line N" for Parse), or the environment variable that set it. It is
	// empty when the value is a default, or for a check that spans keys and
	// none of them was set explicitly.
	Source string
}

// String formats e as "[SOURCE: ]KEY: MESSAGE".
func (e FieldError) String() string {
	if e.Source == "" {
		return e.Key + ": " + e.Message
	}
	return e.Source + ": " + e.Key + ": " + e.Message
}

// ValidationError is every problem found in a configuration, in the order
// found: the file's keys in document order, then the environment, then the
// checks of Validate.
type ValidationError struct {
	Errors []FieldError
}

// Error prints one problem per line.
func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		lines[i] = fe.String()
	}
	return strings.Join(lines, "\n")
}

// problems accumulates FieldErrors; it is what the decoder, the environment
// overlay and Validate share.
type problems []FieldError

func (p *problems) add(key, source, format string, args ...any) {
	*p = append(*p, FieldError{Key: key, Message: fmt.Sprintf(format, args...), Source: source})
}

// err returns p as a *ValidationError, or nil when there is nothing to report
// (never a typed nil inside an interface).
func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return &ValidationError{Errors: p}
}

// didYouMean returns ` (did you mean "X"?)` for the candidate closest to
// word, or "" when none is close enough to be a plausible typo.
func didYouMean(word string, candidates []string) string {
	best, bestDist := "", 0
	for _, c := range candidates {
		d := editDistance(strings.ToLower(word), c)
		if best == "" || d < bestDist {
			best, bestDist = c, d
		}
	}
	// One edit per three characters, and at least one: "htp_addr" and
	// "memroy" get a suggestion, "foo" for "dns" does not.
	if best == "" || bestDist > max(1, len(word)/3) {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the optimal-string-alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of adjacent
// bytes each cost one, so the common "dsn" for "dns" counts as one typo.
func editDistance(a, b string) int {
	// Three rolling rows: two back for transpositions, one back, current.
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
