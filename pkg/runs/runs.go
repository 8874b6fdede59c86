// Package runs keeps run records: one directory per run_code (or autofix)
// call, laid out as docs/SPEC.md "Run records" fixes it, and indexed in SQLite
// (pkg/store) for listing and retention.
//
//	<dir>/<YYYYMMDD_HHMMSS>_<4 hex>/
//	  code_snapshot/          the files as run (autofix: attempt_<n>/ per attempt)
//	  stdout.log  stderr.log  every step's output, up to the log cap per stream
//	  container_info.json     sandbox id, image, limits, cgroup path, network
//	  fixed_attempts.json     [{attempt, error, fix, exit_code, duration_ms}]
//	  metadata.json           runId, language, startTime, endTime, durationMs, exitCode,
//	                          attempts, success, image, sandboxId, termination, ...
//	  output/                 what the program left in /workspace/output
//
// Records are written by the daemon (root) and hold user code and output:
// directories are 0700 and files 0600. A record being written has no index
// row yet; Finish writes metadata.json and indexes the record in one go,
// then applies retention.
package runs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// File names inside a record.
const (
	SnapshotDir       = "code_snapshot"
	StdoutLog         = "stdout.log"
	StderrLog         = "stderr.log"
	ContainerInfoJSON = "container_info.json"
	FixedAttemptsJSON = "fixed_attempts.json"
	MetadataJSON      = "metadata.json"
	OutputDir         = "output"
	// Agent sessions (kind "agent"): stdout.log holds the progress lines,
	// stderr.log the CLI's stderr.
	TranscriptJSONL = "transcript.jsonl"
	AgentResultJSON = "agent_result.json"
	// InputsJSON is what run_code was given besides its files (stdin,
	// env, timeout, ...): what run_replay needs to run it again.
	InputsJSON = "inputs.json"
)

// idRE is the shape of a run id, also its directory name.
var idRE = regexp.MustCompile(`^[0-9]{8}_[0-9]{6}_[0-9a-f]{4}$`)

// ValidID reports whether id has the shape of a run id.
func ValidID(id string) bool { return idRE.MatchString(id) }

// Options configure a Store.
type Options struct {
	// LogCap is how many bytes of each stream a record keeps (0: no cap).
	LogCap int64
	// MaxAge: Prune deletes records older than this (0: never).
	MaxAge time.Duration
	// MaxTotalSize: Prune deletes the oldest records until the rest fit
	// (0: no limit).
	MaxTotalSize int64
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Store is the directory of run records and their index.
type Store struct {
	dir string
	db  *store.Store
	opt Options

	pruneMu sync.Mutex
	// pruned is what the last full Prune left, kept up to date by Finish
	// (guarded by pruneMu), so that a Finish scans every row only when
	// retention has something to do (see prune).
	pruned struct {
		valid  bool
		at     time.Time // of the scan
		total  int64
		oldest time.Time // zero: no records
	}
}

// pruneRescan bounds how long Finish trusts its running totals without a
// full scan: rows it does not see (another daemon's, over a shared
// database) are counted at least this often.
const pruneRescan = time.Minute

// Open opens (creating if needed) the records directory dir.
func Open(dir string, db *store.Store, opt Options) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("runs: %w", err)
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Store{dir: dir, db: db, opt: opt}, nil
}

// Dir is the records directory.
func (s *Store) Dir() string { return s.dir }

// LogCap is the per-stream log cap.
func (s *Store) LogCap() int64 { return s.opt.LogCap }

// Record is a run record being written.
type Record struct {
	ID        string
	Dir       string
	StartedAt time.Time

	Stdout *CappedFile
	Stderr *CappedFile
}

// Create makes the directory of a new record, with empty logs.
func (s *Store) Create() (*Record, error) {
	now := s.opt.Now()
	for range 16 {
		var b [2]byte
		_, _ = rand.Read(b[:])
		id := now.UTC().Format("20060102_150405") + "_" + hex.EncodeToString(b[:])
		dir := filepath.Join(s.dir, id)
		err := os.Mkdir(dir, 0o700)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("runs: create record: %w", err)
		}
		r := &Record{ID: id, Dir: dir, StartedAt: now}
		for _, d := range []string{SnapshotDir, OutputDir} {
			if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
				return nil, fmt.Errorf("runs: create record: %w", err)
			}
		}
		if r.Stdout, err = newCappedFile(filepath.Join(dir, StdoutLog), s.opt.LogCap); err != nil {
			return nil, err
		}
		if r.Stderr, err = newCappedFile(filepath.Join(dir, StderrLog), s.opt.LogCap); err != nil {
			r.Stdout.Close()
			return nil, err
		}
		return r, nil
	}
	return nil, errors.New("runs: create record: no free id")
}

// Reopen opens record id again to add to it: an autofix loop waiting for
// its client's fix between two calls, perhaps across a daemon restart. The
// logs are appended to (still under the cap); the start time is the
// record's first.
func (s *Store) Reopen(id string, startedAt time.Time) (*Record, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("runs: malformed record id %q", id)
	}
	dir := filepath.Join(s.dir, id)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("runs: reopen %s: %w", id, err)
	}
	r := &Record{ID: id, Dir: dir, StartedAt: startedAt}
	var err error
	if r.Stdout, err = openCappedFile(filepath.Join(dir, StdoutLog), s.opt.LogCap, os.O_APPEND); err != nil {
		return nil, err
	}
	if r.Stderr, err = openCappedFile(filepath.Join(dir, StderrLog), s.opt.LogCap, os.O_APPEND); err != nil {
		r.Stdout.Close()
		return nil, err
	}
	return r, nil
}

// safeRel checks that name is a clean relative path that stays inside its
// directory.
func safeRel(name string) error {
	if name == "" || path.IsAbs(name) || !filepath.IsLocal(name) || strings.ContainsRune(name, 0) {
		return fmt.Errorf("runs: file name %q is not a relative path inside the workspace", name)
	}
	return nil
}

// WriteSnapshot stores files (paths relative to /workspace) under
// code_snapshot/, or code_snapshot/<sub>/ when sub is not empty (autofix's
// attempt_<n>).
func (r *Record) WriteSnapshot(sub string, files map[string][]byte) error {
	base := filepath.Join(r.Dir, SnapshotDir)
	if sub != "" {
		if err := safeRel(sub); err != nil {
			return err
		}
		base = filepath.Join(base, sub)
	}
	for name, data := range files {
		if err := safeRel(name); err != nil {
			return err
		}
		if err := r.WriteFile(filepath.Join(base, name), data); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes a file below the record's directory (an absolute path
// under r.Dir, or one relative to it), creating parent directories.
func (r *Record) WriteFile(name string, data []byte) error {
	if !filepath.IsAbs(name) {
		if err := safeRel(name); err != nil {
			return err
		}
		name = filepath.Join(r.Dir, name)
	}
	rel, err := filepath.Rel(r.Dir, name)
	if err != nil || !filepath.IsLocal(rel) {
		return fmt.Errorf("runs: %q is outside the record", name)
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	if err := os.WriteFile(name, data, 0o600); err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	return nil
}

// WriteJSON writes v, indented, as the record's file name.
func (r *Record) WriteJSON(name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("runs: encode %s: %w", name, err)
	}
	return r.WriteFile(name, append(b, '\n'))
}

// OutputPath is where the file name (relative to /workspace/output) of the
// program's output goes.
func (r *Record) OutputPath(name string) (string, error) {
	if err := safeRel(name); err != nil {
		return "", err
	}
	return filepath.Join(r.Dir, OutputDir, name), nil
}

// Close closes the logs.
func (r *Record) Close() error {
	return errors.Join(r.Stdout.Close(), r.Stderr.Close())
}

// Termination is how the run ended, as metadata.json spells it.
type Termination = apitypes.RunTermination

// Step is one step of a run in metadata.json.
type Step = apitypes.RunStepRecord

// Metadata is metadata.json: the fields docs/SPEC.md names first, then more.
type Metadata = apitypes.RunMetadata

// FixedAttempt is one entry of fixed_attempts.json.
type FixedAttempt = apitypes.FixedAttempt

// Finish closes the logs, writes metadata.json (filling in the logged byte
// counts), indexes the record and applies retention. fixed_attempts.json is
// written as an empty list unless the caller wrote it.
func (s *Store) Finish(ctx context.Context, r *Record, m *Metadata) error {
	closeErr := r.Close()
	m.RunID = r.ID
	if m.Kind == "" {
		m.Kind = "run"
	}
	if m.Attempts == 0 {
		m.Attempts = 1
	}
	m.StdoutLogged, m.StderrLogged = r.Stdout.Written(), r.Stderr.Written()
	if _, err := os.Stat(filepath.Join(r.Dir, FixedAttemptsJSON)); errors.Is(err, fs.ErrNotExist) {
		if err := r.WriteJSON(FixedAttemptsJSON, []FixedAttempt{}); err != nil {
			return err
		}
	}
	if err := r.WriteJSON(MetadataJSON, m); err != nil {
		return err
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("runs: encode metadata: %w", err)
	}
	size, err := dirSize(r.Dir)
	if err != nil {
		return fmt.Errorf("runs: size of %s: %w", r.ID, err)
	}
	rec := &store.RunRecord{
		ID: r.ID, Kind: m.Kind, Language: m.Language, SandboxID: m.SandboxID, Image: m.Image,
		StartedAt: m.StartTime, EndedAt: m.EndTime, DurationMS: m.DurationMS, ExitCode: m.ExitCode,
		Success: m.Success, Termination: m.Termination.Cause, SizeBytes: size, Metadata: raw,
	}
	if err := s.db.PutRun(ctx, rec); err != nil {
		return err
	}
	if err := s.prune(ctx, size, m.StartTime); err != nil {
		return err
	}
	return closeErr
}

// prune applies retention after a record of size bytes started at started
// was indexed. Scanning every record's size (RunSizes) on every run would
// make each run's cost grow with the number of records kept; the totals of
// the last scan plus what was added since say whether retention has
// anything to delete, and only then, or pruneRescan after the last scan,
// Prune scans. The totals may overcount (a record finished twice, one
// deleted elsewhere), never undercount what this daemon added, so
// retention is never later than a scan per Finish would have been.
func (s *Store) prune(ctx context.Context, size int64, started time.Time) error {
	if s.opt.MaxAge <= 0 && s.opt.MaxTotalSize <= 0 {
		return nil
	}
	now := s.opt.Now()
	s.pruneMu.Lock()
	p := &s.pruned
	if p.valid && now.Sub(p.at) < pruneRescan && !now.Before(p.at) {
		p.total += size
		if p.oldest.IsZero() || started.Before(p.oldest) {
			p.oldest = started
		}
		old := s.opt.MaxAge > 0 && p.oldest.Before(now.Add(-s.opt.MaxAge))
		big := s.opt.MaxTotalSize > 0 && p.total > s.opt.MaxTotalSize
		if !old && !big {
			s.pruneMu.Unlock()
			return nil
		}
	}
	s.pruneMu.Unlock()
	_, err := s.Prune(ctx)
	return err
}

// Run is a stored run: its metadata and (the start of) its logs.
type Run = apitypes.RunRecord

// Get reads run id with up to maxLog bytes of each log.
func (s *Store) Get(ctx context.Context, id string, maxLog int64) (*Run, error) {
	if !ValidID(id) {
		return nil, errdefs.Invalidf("run_id: malformed %q (want YYYYMMDD_HHMMSS_xxxx)", id)
	}
	rec, err := s.db.GetRun(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.NotFoundf("run %s not found", id)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read run %s", id)
	}
	run := &Run{Dir: filepath.Join(s.dir, id), Attempts: []FixedAttempt{}}
	if err := json.Unmarshal(rec.Metadata, &run.Metadata); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "decode run %s metadata", id)
	}
	run.Stdout, run.StdoutTruncated = readHead(filepath.Join(run.Dir, StdoutLog), maxLog)
	run.Stderr, run.StderrTruncated = readHead(filepath.Join(run.Dir, StderrLog), maxLog)
	if b, err := os.ReadFile(filepath.Join(run.Dir, FixedAttemptsJSON)); err == nil {
		_ = json.Unmarshal(b, &run.Attempts)
	}
	run.Code, run.CodeTruncated = readSnapshot(filepath.Join(run.Dir, SnapshotDir), maxLog)
	return run, nil
}

// maxSnapshotRead caps the code snapshot one Get returns, all files together.
const maxSnapshotRead = 8 << 20

// readSnapshot reads the text files under dir, each up to max bytes, up to
// maxSnapshotRead in all; truncated says something was cut or skipped.
func readSnapshot(dir string, max int64) (map[string]string, bool) {
	files := map[string]string{}
	truncated := false
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return nil
		}
		text, cut := readHead(p, max)
		if !utf8.ValidString(text) && !cut || total+int64(len(text)) > maxSnapshotRead {
			truncated = true // binary, or over the total cap
			return nil
		}
		total += int64(len(text))
		files[filepath.ToSlash(rel)] = text
		truncated = truncated || cut
		return nil
	})
	return files, truncated
}

// Inputs is inputs.json: a run_code request's inputs besides its files
// (code_snapshot/), its limits and network (container_info.json). It holds
// the request's env, which may carry secrets: the record's 0600 mode
// guards it like the code, and run_get never returns it.
type Inputs struct {
	Stdin     string            `json:"stdin,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Install   bool              `json:"install"`
	TimeoutMS int64             `json:"timeoutMs"`
	Backend   string            `json:"backend,omitempty"`
	Root      bool              `json:"root,omitempty"`
}

// ContainerInfo is the part of container_info.json a replay reads back.
type ContainerInfo struct {
	Image       string          `json:"image"`
	ImageDigest string          `json:"imageDigest"`
	Limits      apitypes.Limits `json:"limits"`
	Network     string          `json:"network"`
}

// ReadJSON decodes the file name of record id into v; a missing file is
// an error wrapping fs.ErrNotExist.
func (s *Store) ReadJSON(id, name string, v any) error {
	if !ValidID(id) {
		return fmt.Errorf("runs: malformed record id %q", id)
	}
	if err := safeRel(name); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(s.dir, id, name))
	if err != nil {
		return fmt.Errorf("runs: %s of %s: %w", name, id, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("runs: decode %s of %s: %w", name, id, err)
	}
	return nil
}

// ReadTree returns every regular file under sub (code_snapshot, output)
// of record id, by slash path relative to sub, up to max bytes in all.
// Symbolic links are not followed: the daemon wrote these trees itself.
func (s *Store) ReadTree(id, sub string, max int64) (map[string][]byte, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("runs: malformed record id %q", id)
	}
	if err := safeRel(sub); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.dir, id, sub)
	files := map[string][]byte{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return fs.SkipAll // a record without the directory: none
		}
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if total += int64(len(b)); total > max {
			return fmt.Errorf("runs: %s of %s holds more than %d bytes", sub, id, max)
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("runs: read %s of %s: %w", sub, id, err)
	}
	return files, nil
}

// Logs returns record id's stdout.log and stderr.log whole (each at most
// the log cap it was written under).
func (s *Store) Logs(id string) (stdout, stderr []byte, err error) {
	if !ValidID(id) {
		return nil, nil, fmt.Errorf("runs: malformed record id %q", id)
	}
	if stdout, err = os.ReadFile(filepath.Join(s.dir, id, StdoutLog)); err != nil {
		return nil, nil, fmt.Errorf("runs: %w", err)
	}
	if stderr, err = os.ReadFile(filepath.Join(s.dir, id, StderrLog)); err != nil {
		return nil, nil, fmt.Errorf("runs: %w", err)
	}
	return stdout, stderr, nil
}

// List returns the metadata of the runs f selects, newest first.
func (s *Store) List(ctx context.Context, f store.RunFilter) ([]Metadata, error) {
	recs, err := s.db.ListRuns(ctx, f)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list runs")
	}
	out := make([]Metadata, 0, len(recs))
	for _, r := range recs {
		var m Metadata
		if err := json.Unmarshal(r.Metadata, &m); err != nil {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

// Prune deletes the records older than MaxAge, then the oldest ones until
// the rest fit in MaxTotalSize, and returns how many it deleted.
func (s *Store) Prune(ctx context.Context) (int, error) {
	if s.opt.MaxAge <= 0 && s.opt.MaxTotalSize <= 0 {
		return 0, nil
	}
	s.pruneMu.Lock()
	defer s.pruneMu.Unlock()
	sizes, err := s.db.RunSizes(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, r := range sizes {
		total += r.SizeBytes
	}
	now := s.opt.Now()
	cutoff := now.Add(-s.opt.MaxAge)
	n := 0
	var errs []error
	var oldest time.Time
	for _, r := range sizes { // oldest first
		old := s.opt.MaxAge > 0 && r.StartedAt.Before(cutoff)
		big := s.opt.MaxTotalSize > 0 && total > s.opt.MaxTotalSize
		if !old && !big {
			oldest = r.StartedAt
			break
		}
		if err := s.remove(ctx, r.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		total -= r.SizeBytes
		n++
	}
	// A record that could not be removed is still counted: the next
	// Finish scans again.
	s.pruned.valid, s.pruned.at, s.pruned.total, s.pruned.oldest = len(errs) == 0, now, total, oldest
	return n, errors.Join(errs...)
}

func (s *Store) remove(ctx context.Context, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("runs: refusing to remove %q", id)
	}
	// The row goes first: a record without a row is invisible, one with a
	// row and no directory would be listed but unreadable.
	if err := s.db.DeleteRun(ctx, id); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(s.dir, id)); err != nil {
		return fmt.Errorf("runs: remove %s: %w", id, err)
	}
	return nil
}

func readHead(name string, max int64) (string, bool) {
	f, err := os.Open(name)
	if err != nil {
		return "", false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", false
	}
	n := fi.Size()
	if max > 0 && n > max {
		n = max
	}
	buf := make([]byte, n)
	m, _ := f.ReadAt(buf, 0)
	return string(buf[:m]), int64(m) < fi.Size()
}

func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		total += fi.Size()
		return nil
	})
	return total, err
}

// CappedFile is a log file that keeps the first cap bytes written to it and
// counts the rest. It is safe for concurrent use.
type CappedFile struct {
	mu      sync.Mutex
	f       *os.File
	cap     int64
	written int64
	total   int64
	err     error
}

func newCappedFile(name string, cap int64) (*CappedFile, error) {
	return openCappedFile(name, cap, os.O_TRUNC)
}

// openCappedFile opens a log with mode O_TRUNC (a new log) or O_APPEND (to
// continue one: what it holds counts against the cap).
func openCappedFile(name string, cap int64, mode int) (*CappedFile, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|mode, 0o600)
	if err != nil {
		return nil, fmt.Errorf("runs: %w", err)
	}
	c := &CappedFile{f: f, cap: cap}
	if mode&os.O_APPEND != 0 {
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("runs: %w", err)
		}
		c.written, c.total = fi.Size(), fi.Size()
	}
	return c, nil
}

// Write keeps what fits under the cap; it never fails, so that a full disk
// does not fail the run (Err reports it).
func (c *CappedFile) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if c.f == nil || c.err != nil {
		return len(p), nil
	}
	q := p
	if c.cap > 0 {
		room := c.cap - c.written
		if room <= 0 {
			return len(p), nil
		}
		if int64(len(q)) > room {
			q = q[:room]
		}
	}
	n, err := c.f.Write(q)
	c.written += int64(n)
	if err != nil {
		c.err = err
	}
	return len(p), nil
}

// Written is how many bytes the file holds.
func (c *CappedFile) Written() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

// Total is how many bytes were written to it, kept or not.
func (c *CappedFile) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Close closes the file; later writes are counted and dropped.
func (c *CappedFile) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		return c.err
	}
	err := c.f.Close()
	c.f = nil
	return errors.Join(c.err, err)
}
