package apitypes

import (
	"encoding/base64"
	"unicode/utf8"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// DecodeFileContent is a FileWriteRequest's content as bytes. It lives
// here, beside the request, because two engines shape files this way: the
// daemon's (pkg/engine) and the gateway's over the nodes' REST API
// (pkg/gateway/remote), which uploads the bytes and must refuse what the
// daemon refuses, in its words.
func DecodeFileContent(encoding, content string) ([]byte, error) {
	switch encoding {
	case "", "utf-8", "utf8":
		if !utf8.ValidString(content) {
			return nil, errdefs.Invalidf("content: not valid UTF-8 (use encoding base64)")
		}
		return []byte(content), nil
	case "base64":
		data, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, errdefs.Invalidf("content: invalid base64: %v", err)
		}
		return data, nil
	default:
		return nil, errdefs.Invalidf("encoding: must be utf-8 or base64, got %q", encoding)
	}
}

// CheckReadEncoding refuses a FileReadRequest's encoding other than
// utf-8 or base64.
func CheckReadEncoding(encoding string) error {
	switch encoding {
	case "", "utf-8", "utf8", "base64":
		return nil
	}
	return errdefs.Invalidf("encoding: must be utf-8 or base64, got %q", encoding)
}

// NewFileReadResult is the answer to req of a read that returned data of
// the file at path (size bytes in all; truncated when the file goes on past
// data): text when asked for and valid UTF-8, else base64, and where the
// next read starts. Shared by the daemon's engine and the gateway's (see
// DecodeFileContent).
func NewFileReadResult(req FileReadRequest, path string, size int64, truncated bool, data []byte) *FileReadResult {
	enc := req.Encoding
	if enc == "" || enc == "utf8" {
		enc = "utf-8"
	}
	res := &FileReadResult{Path: path, Size: size, Offset: req.Offset, Encoding: enc}
	if enc == "utf-8" && utf8.Valid(data) {
		res.Content = string(data)
	} else {
		res.Encoding, res.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	if next := req.Offset + int64(len(data)); truncated || next < size {
		res.Truncated, res.NextOffset = true, next
	}
	return res
}
