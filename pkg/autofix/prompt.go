package autofix

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Sizes of a fix request.
const (
	// ErrorTailBytes is how much of the failing step's output a fix
	// request carries (its end: where the error is).
	ErrorTailBytes = 4000
	// maxPromptFileBytes caps each file's content in the prompt; a longer
	// file is cut (and the fixer told so).
	maxPromptFileBytes = 64 << 10
)

// FixRequest is what a provider gets: the failing attempt and everything
// the fixer needs to write the next one.
type FixRequest struct {
	Language   string
	Entrypoint string
	Files      Files
	// Attempt is the failing attempt (a run); the fix makes attempt+1.
	Attempt     int
	MaxAttempts int
	Success     string
	FailedStep  string // install, compile, run or test
	ExitCode    int
	Termination apitypes.Termination
	// Error is the tail of the failing step's output.
	Error string
	// Earlier says what the earlier attempts did, so that the fixer does
	// not repeat itself.
	Earlier []string
	// Refused says why the previous answer could not be applied.
	Refused string
	// BlockedSyscalls are the system calls the sandbox's seccomp filter
	// refused during the attempt: a program that needs them cannot work
	// here, whatever else the fix changes.
	BlockedSyscalls []apitypes.BlockedSyscall
}

// Prompt renders the request as the text a model or a program reads.
func (r *FixRequest) Prompt() string {
	var b strings.Builder
	fmt.Fprintf(&b, "This %s program fails. Fix it.\n\n", r.Language)
	fmt.Fprintf(&b, "Attempt %d of at most %d failed at the %s step: %s.\n", r.Attempt, r.MaxAttempts, r.FailedStep, describeTermination(r.ExitCode, r.Termination))
	fmt.Fprintf(&b, "It counts as fixed when %s.\n", ruleText(r.Success))
	fmt.Fprintf(&b, "The entrypoint is %s; the files are in %s.\n\n", r.Entrypoint, Workspace)
	if len(r.BlockedSyscalls) > 0 {
		b.WriteString("The sandbox refused these system calls (seccomp; they are not allowed here, so the program must do without them):")
		for _, c := range r.BlockedSyscalls {
			fmt.Fprintf(&b, " %s ×%d", c.Name, c.Count)
		}
		b.WriteString(".\n\n")
	}
	if r.Error != "" {
		b.WriteString("Error output (its end):\n````text\n")
		b.WriteString(ensureNewline(r.Error))
		b.WriteString("````\n\n")
	}
	if len(r.Earlier) > 0 {
		b.WriteString("Earlier attempts (do not repeat them):\n")
		for _, e := range r.Earlier {
			b.WriteString("- " + e + "\n")
		}
		b.WriteString("\n")
	}
	if r.Refused != "" {
		fmt.Fprintf(&b, "Your previous answer could not be applied: %s.\n\n", r.Refused)
	}
	b.WriteString("Files:\n\n")
	for _, name := range r.Files.Names() {
		content := r.Files[name]
		cut := ""
		if len(content) > maxPromptFileBytes {
			content = content[:maxPromptFileBytes]
			cut = fmt.Sprintf("\n[... cut: the file has %d bytes]\n", len(r.Files[name]))
		}
		text := string(content)
		if !utf8.ValidString(text) {
			text = "[binary file]"
		}
		fmt.Fprintf(&b, "````%s %s\n%s%s````\n\n", fenceLang(r.Language), name, ensureNewline(text), cut)
	}
	b.WriteString("Answer with the complete new content of every file you change, each in a fenced code block " +
		"whose info string is the language and the file's path, for example:\n\n")
	fmt.Fprintf(&b, "```%s %s\n...\n```\n\n", fenceLang(r.Language), r.Entrypoint)
	b.WriteString("or with a unified diff of the files (paths relative to " + Workspace + "). " +
		"Add a dependency to the project's dependency file (requirements.txt, package.json, go.mod, ...) when one is missing. " +
		"Give only the code, no explanation.\n")
	return b.String()
}

// fenceLang is the info-string language of a language name.
func fenceLang(lang string) string {
	if lang == "" {
		return "text"
	}
	return lang
}

func ruleText(rule string) string {
	switch rule {
	case apitypes.SuccessExitZero:
		return "every step exits with status 0"
	case apitypes.SuccessTests:
		return "every step exits with status 0 and the tests pass"
	default:
		return "every step exits with status 0 and the program writes nothing to stderr"
	}
}

// describeTermination says how a step ended: "exit code 1", "killed by
// SIGSEGV", "timed out", ...
func describeTermination(code int, t apitypes.Termination) string {
	s := ""
	switch t.Cause {
	case apitypes.CauseExited, "":
		s = fmt.Sprintf("exit code %d", code)
	case apitypes.CauseSignal:
		s = "killed by " + t.Signal
	case apitypes.CauseTimeout:
		s = "timed out"
	case apitypes.CauseOOM:
		s = "killed: out of memory"
	case apitypes.CauseOutputLimit:
		s = "killed: too much output"
	default:
		s = t.Cause
	}
	if t.Detail != "" {
		s += " (" + t.Detail + ")"
	}
	return s
}

// tail is the end of s, at most n bytes, starting at a line when it can.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	t := s[len(s)-n:]
	if i := strings.IndexByte(t, '\n'); i >= 0 && i < len(t)-1 {
		t = t[i+1:]
	}
	for !utf8.ValidString(t) && len(t) > 0 {
		t = t[1:]
	}
	return t
}

// excerpt is a short one-line form of an error tail: its last non-blank
// line, capped.
func excerpt(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if len(last) > 200 {
		last = last[:200] + "..."
	}
	return last
}
