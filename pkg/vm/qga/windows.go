package qga

import (
	"bytes"
	"regexp"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/encoding/charmap"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// What Windows guests need from a client of qemu-ga, which runs there as
// the LocalSystem service: programs get a console in the OEM code page
// (437 or 850 on western installs) unless told otherwise, lines end in
// CRLF, merged capture is compiled out (see ExecRequest.Merged), and paths
// are drive-letter paths.

// ShellCommand returns the program and arguments that run a shell command
// line in a guest of the given OS ("linux" or "windows"). On Windows the
// command runs under cmd.exe with the console switched to UTF-8 first, so
// that its output is UTF-8 whatever the OEM code page is; output of
// programs that ignore the console code page still needs DecodeOutput.
func ShellCommand(os, command string) (path string, args []string, err error) {
	switch os {
	case "linux":
		return "/bin/sh", []string{"-c", command}, nil
	case "windows":
		return `C:\Windows\System32\cmd.exe`, []string{"/d", "/s", "/c", "chcp 65001 >NUL & " + command}, nil
	default:
		return "", nil, errdefs.Invalidf("os: %q is not linux or windows", os)
	}
}

var windowsPathRE = regexp.MustCompile(`^[A-Za-z]:\\`)

// CheckPath checks that p is an absolute path of the guest's OS.
func CheckPath(os, p string) error {
	switch {
	case strings.ContainsRune(p, 0):
		return errdefs.Invalidf("path: contains a NUL byte")
	case os == "windows" && !windowsPathRE.MatchString(p):
		return errdefs.Invalidf(`path: %q is not an absolute Windows path (C:\...)`, p)
	case os != "windows" && !strings.HasPrefix(p, "/"):
		return errdefs.Invalidf("path: %q is not absolute", p)
	}
	return nil
}

// oemCodePages are the console code pages DecodeOutput knows.
var oemCodePages = map[int]*charmap.Charmap{
	437:  charmap.CodePage437,
	850:  charmap.CodePage850,
	852:  charmap.CodePage852,
	866:  charmap.CodePage866,
	1250: charmap.Windows1250,
	1251: charmap.Windows1251,
	1252: charmap.Windows1252,
}

// DecodeOutput turns output of a Windows program into UTF-8 text with LF
// line ends. codePage 65001 (or 0: unknown) keeps valid UTF-8 as it is; a
// known OEM/ANSI code page is decoded. Output that is not valid UTF-8 under
// 65001/0 is decoded as code page 437, the OEM default, rather than
// returned with replacement characters.
func DecodeOutput(b []byte, codePage int) (string, error) {
	var s string
	switch cm, ok := oemCodePages[codePage]; {
	case ok:
		d, err := cm.NewDecoder().Bytes(b)
		if err != nil {
			return "", errdefs.Wrap(errdefs.Internal, err, "decode code page %d", codePage)
		}
		s = string(d)
	case codePage == 65001 || codePage == 0:
		if utf8.Valid(b) {
			s = string(b)
		} else {
			d, _ := charmap.CodePage437.NewDecoder().Bytes(b)
			s = string(d)
		}
	default:
		return "", errdefs.Invalidf("code_page: %d is not one of 437, 850, 852, 866, 1250, 1251, 1252, 65001", codePage)
	}
	return string(bytes.ReplaceAll([]byte(s), []byte("\r\n"), []byte("\n"))), nil
}
