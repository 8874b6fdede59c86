package main

import "testing"

func TestUIBaseURL(t *testing.T) {
	for addr, want := range map[string]string{
		"":               "",
		"127.0.0.1:7070": "http://127.0.0.1:7070",
		"0.0.0.0:7070":   "http://127.0.0.1:7070", // a browser cannot open the wildcard
		"[::]:7070":      "http://127.0.0.1:7070",
		":7070":          "http://127.0.0.1:7070",
		"[::1]:8080":     "http://[::1]:8080",
		"localhost:9000": "http://localhost:9000",
	} {
		if got := uiBaseURL(addr); got != want {
			t.Errorf("uiBaseURL(%q) = %q, want %q", addr, got, want)
		}
	}
}
