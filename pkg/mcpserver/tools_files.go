package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

type fileWriteIn = apitypes.FileWriteRequest

type fileOut = apitypes.FileResult

type fileReadIn = apitypes.FileReadRequest

type fileReadOut = apitypes.FileReadResult

type fileListIn = apitypes.FileListRequest

type fileListOut = apitypes.FileList

type fileDeleteIn struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (sandbox_create)."`
	Path      string `json:"path" jsonschema_description:"Absolute path of the file or directory to delete."`
	Recursive bool   `json:"recursive,omitempty" jsonschema_description:"Delete a directory and everything under it."`
}

// fileDeleteOut is file_delete's answer, as REST's: the path (size 0).
type fileDeleteOut = apitypes.FileResult

type filesExportIn struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (sandbox_create)."`
	Path      string `json:"path,omitempty" jsonschema_description:"Absolute path of the directory to export; default /workspace."`
}

type filesExportOut = apitypes.Artifact

func (s *srv) addFileTools() {
	addTool[fileWriteIn, fileOut](s, "file_write", "Write a file in a sandbox",
		fmt.Sprintf("Write (or append to) a file in a sandbox, creating parent directories; returns its path and size. Prerequisite: a live sandbox_id from sandbox_create. Paths are absolute and resolve inside the sandbox; the root filesystem outside /workspace, /tmp and the home directory is read-only. At most %d MiB per call.", engine.MaxFileBytes>>20),
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *fileWriteIn) (*result, error) {
			res, err := s.e.WriteFile(ctx, *in)
			if err != nil {
				return nil, err
			}
			out := *res
			return &result{structured: out, text: fmt.Sprintf("wrote %s (%d bytes)", out.Path, out.Size)}, nil
		})

	addTool[fileReadIn, fileReadOut](s, "file_read", "Read a file in a sandbox",
		"Read a file in a sandbox. Prerequisite: a live sandbox_id. A file larger than one tool result is returned in pages: truncated is true and next_offset is where to continue (pass it as offset).",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *fileReadIn) (*result, error) {
			return s.readFilePaged(ctx, in, s.e.ReadFile)
		})

	addTool[fileListIn, fileListOut](s, "file_list", "List files in a sandbox",
		"List the files of a directory in a sandbox (default /workspace), or with recursive the whole tree: path, type, size, mode, mtime of each entry. Prerequisite: a live sandbox_id. A list too long for one result is cut (truncated: true): list a subdirectory instead.",
		annotations{readOnly: true, idempotent: true},
		s.fileList)

	addTool[fileDeleteIn, fileDeleteOut](s, "file_delete", "Delete a file in a sandbox",
		"Delete a file, or with recursive a directory tree, in a sandbox. Prerequisite: a live sandbox_id. Deleting / is refused.",
		annotations{destructive: true, idempotent: false},
		func(ctx context.Context, c *call, in *fileDeleteIn) (*result, error) {
			res, err := s.e.DeleteFile(ctx, in.SandboxID, in.Path, in.Recursive)
			if err != nil {
				return nil, err
			}
			return &result{structured: *res, text: "deleted " + res.Path}, nil
		})

	addTool[filesExportIn, filesExportOut](s, "files_export", "Export a sandbox directory as tar.gz",
		"Pack a directory of a sandbox (default /workspace) into a tar.gz that the daemon keeps after the sandbox is gone; returns its artifact_id, size and sha256. Download it over REST (GET /v1/artifacts/{artifact_id}) or with `sandboxctl export`. Prerequisite: a live sandbox_id. The archive is limited by sandbox.output_limit.",
		annotations{idempotent: false},
		func(ctx context.Context, c *call, in *filesExportIn) (*result, error) {
			art, err := s.e.ExportFiles(ctx, in.SandboxID, in.Path)
			if err != nil {
				return nil, err
			}
			return &result{structured: *art, text: fmt.Sprintf("exported %s of %s as %s (%d bytes, sha256 %s); download: GET %s",
				art.Path, art.SandboxID, art.ID, art.Size, art.SHA256, art.DownloadPath)}, nil
		})
}

// readFilePaged reads as much of a file as one tool result holds
// (file_read): the content is in the structured content (and its JSON
// text block), never also in the summary.
func (s *srv) readFilePaged(ctx context.Context, in *fileReadIn, read func(context.Context, apitypes.FileReadRequest) (*apitypes.FileReadResult, error)) (*result, error) {
	page := int64(s.opt.MaxResultBytes - 2048)
	if in.Encoding == "base64" {
		page = page * 3 / 4
	}
	if in.MaxBytes > 0 && in.MaxBytes < page {
		page = in.MaxBytes
	}
	for {
		req := *in
		req.MaxBytes = page
		raw, err := read(ctx, req)
		if err != nil {
			return nil, err
		}
		out := *raw
		head := fmt.Sprintf("%s: %d bytes, %s", out.Path, out.Size, out.Encoding)
		if out.Truncated {
			head += fmt.Sprintf("; bytes %d to %d shown, continue at offset %d", in.Offset, out.NextOffset, out.NextOffset)
		}
		r := &result{structured: out, text: head + " (the content is in the JSON below)"}
		if resultSize(r) <= s.opt.MaxResultBytes || page <= 512 {
			return r, nil
		}
		page /= 2
	}
}

// fileList is file_list: the engine's page of the listing, cut further to
// fit the result.
func (s *srv) fileList(ctx context.Context, c *call, in *fileListIn) (*result, error) {
	req := *in
	if req.MaxEntries == 0 {
		// The result's size cuts the list below, not a count.
		req.MaxEntries = engine.MaxListEntries
	}
	l, err := s.e.ListFilesPage(ctx, req)
	if err != nil {
		return nil, err
	}
	entries := l.Entries
	return s.fit(func(limit int) *result {
		out := fileListOut{Entries: []apitypes.FileEntry{}, Total: l.Total, Truncated: l.Truncated}
		var text strings.Builder
		size := 0
		for _, fe := range entries {
			line := fmt.Sprintf("%s %o %8d %s\n", fe.Type, fe.Mode, fe.Size, fe.Path)
			size += 2*len(fe.Path) + 120
			if size > limit {
				out.Truncated = true
				break
			}
			out.Entries = append(out.Entries, fe)
			text.WriteString(line)
		}
		if out.Truncated {
			fmt.Fprintf(&text, "[list cut at %d of %d entries to fit the result; list a subdirectory]\n", len(out.Entries), out.Total)
		}
		if len(entries) == 0 {
			text.WriteString("(empty)\n")
		}
		return &result{structured: out, text: text.String()}
	}), nil
}
