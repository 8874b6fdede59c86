package testenv

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// Fixtures that let dependency installs run without a network: a
// local wheel for pip, a local tarball for npm.

// Wheel returns a minimal pure-Python wheel of package name.
func Wheel(t testing.TB, name, version, code string) []byte {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	di := name + "-" + version + ".dist-info/"
	files := []struct{ name, body string }{
		{name + "/__init__.py", code},
		{di + "METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"},
		{di + "WHEEL", "Wheel-Version: 1.0\nGenerator: sandboxd-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f.body)
		fmt.Fprintf(&record, "%s,,\n", f.name)
	}
	fmt.Fprintf(&record, "%sRECORD,,\n", di)
	w, _ := zw.Create(di + "RECORD")
	io.WriteString(w, record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// NPMTarball returns an npm package tarball (package/ prefix).
func NPMTarball(t testing.TB, files map[string]string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: "package/" + name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	gz.Close()
	return buf.Bytes()
}
