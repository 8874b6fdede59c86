// Package audit keeps the daemon's tamper-evident audit log: one JSON line
// per authentication failure and per call that changes anything (who, what,
// on what, how it ended, from where, through which front end, when), each
// line carrying the SHA-256 of the line before it and of itself, so that an
// edited, removed, inserted or reordered record breaks the chain at that
// record (Verify names it).
//
// Durability: Append returns only once the record's line is on disk (group
// commit: concurrent appends share one write), and the front ends call it
// before they send the call's answer — a client never sees an answer whose
// record a crash could lose. A daemon killed mid-write leaves at worst a
// torn last line, which Open cuts off (it was never acknowledged) and Verify
// ignores.
//
// Cost: the current file is preallocated in segments (zeros written ahead,
// so its size and blocks already cover the records to come) and written
// with O_DSYNC pwrites. An append then changes no metadata the filesystem must journal
// (no new size, no new blocks), so making it durable is one data write
// rather than a data write plus a journal commit, as append-and-fdatasync
// was (on ext4: median 80 µs instead of 150 µs, and no multi-millisecond
// tail). The unused end of a file is zeros: readers stop at them, and a
// file is cut to its records when it is rotated or the log closed.
//
// Checkpoints: every so many records (and at every rotation) the newest
// record's sequence number and hash are stored in the state database
// (Checkpoints). Someone who rewrites the whole chain from some record on —
// recomputing every hash, which the chain alone cannot catch — or cuts off
// its tail, still disagrees with the database, and Verify says where.
//
// Files rotate by size and age (audit-<first seq>.jsonl, ordered by name);
// the chain runs on across files, and retention deletes the oldest files by
// total size and age, together with their checkpoints, so that a file
// removed by anything else is detected.
package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Outcomes of a record.
const (
	Success = "success"
	Failure = "failure"
)

// ActionAuthenticate is the action of an authentication failure.
const ActionAuthenticate = "authenticate"

// zeroHash is the prev of the very first record.
var zeroHash = strings.Repeat("0", 64)

// Record is one line of the log. Its JSON form is canonical: the fields in
// this order, compact, hash last (Verify refuses a line that is not exactly
// what marshalling its fields gives).
type Record struct {
	// Seq numbers records from 1, without gaps, across files.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Who: the API key's id and name (never its secret) and tenant.
	KeyID   string `json:"key_id,omitempty"`
	KeyName string `json:"key_name,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	Admin   bool   `json:"admin,omitempty"`
	// FrontEnd is "rest", "mcp", "e2b", "socket", ... (principal.Origin).
	FrontEnd string `json:"front_end"`
	// Source is the client's address (host:port), "unix" for the socket.
	Source string `json:"source,omitempty"`
	// Action is what was asked: a REST route ("POST /v1/sandboxes/{id}/exec"),
	// an MCP tool ("mcp:exec"), an E2B route, or "authenticate".
	Action string `json:"action"`
	// Target is what it was asked of (a sandbox id, an image name, ...).
	Target string `json:"target,omitempty"`
	// Outcome is Success or Failure; Code the pkg/errdefs code of a failure.
	Outcome string `json:"outcome"`
	Code    string `json:"code,omitempty"`
	// Status is the HTTP status of the answer, where there is one.
	Status int `json:"status,omitempty"`
	// Prev is the hex SHA-256 of the record before (64 zeros for seq 1).
	Prev string `json:"prev"`
	// Hash is the hex SHA-256 of this line's bytes up to the hash field
	// (the canonical JSON with its closing brace replaced by ,"hash":").
	Hash string `json:"hash,omitempty"`
}

// hashSuffixLen is the length of `,"hash":"<64 hex>"}`.
const hashSuffixLen = len(`,"hash":"`) + 64 + len(`"}`)

// encode returns r's line (without newline) with its hash, which it sets.
func (r *Record) encode() ([]byte, error) {
	r.Hash = ""
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	// body ends in "}": the hash covers everything before it plus the
	// field's opening, so that the hash field is the only thing it omits.
	head := append(body[:len(body)-1:len(body)-1], `,"hash":"`...)
	sum := sha256.Sum256(head)
	r.Hash = hex.EncodeToString(sum[:])
	return append(append(head, r.Hash...), `"}`...), nil
}

// Checkpoint is a record's sequence number and hash as stored in the state
// database.
type Checkpoint struct {
	Seq  uint64
	Hash string
	At   time.Time
}

// Checkpoints is where checkpoints are kept (the state database; the engine
// adapts pkg/store).
type Checkpoints interface {
	SaveAuditCheckpoint(ctx context.Context, c Checkpoint) error
	AuditCheckpoints(ctx context.Context) ([]Checkpoint, error)
	// DeleteAuditCheckpointsBefore forgets the checkpoints of records that
	// retention removed.
	DeleteAuditCheckpointsBefore(ctx context.Context, seq uint64) error
}

// Options configure Open. Zero sizes and ages mean the defaults below;
// RetentionAge and MaxTotalBytes below zero mean no limit.
type Options struct {
	Dir string
	// MaxFileBytes rotates a file once it is this large.
	MaxFileBytes int64
	// MaxFileAge rotates a file once its first record is this old.
	MaxFileAge time.Duration
	// MaxTotalBytes deletes the oldest files while all of them together are
	// larger (the current file is never deleted).
	MaxTotalBytes int64
	// RetentionAge deletes files whose last record is older.
	RetentionAge time.Duration
	// CheckpointEvery stores a checkpoint after this many records.
	CheckpointEvery uint64
	// CheckpointInterval stores one at least this often while records come.
	CheckpointInterval time.Duration
	// VerifyInterval verifies the whole log this long after Open and then
	// at this interval (LastVerification, the sandboxd_audit_chain_ok
	// gauge); 0: only when Verify is called.
	VerifyInterval time.Duration
	Checkpoints    Checkpoints // nil: none
	Log            *slog.Logger
	Now            func() time.Time // tests; nil: time.Now
}

// Defaults of Options.
const (
	DefaultMaxFileBytes       = 64 << 20
	DefaultMaxFileAge         = 24 * time.Hour
	DefaultMaxTotalBytes      = 1 << 30
	DefaultRetentionAge       = 90 * 24 * time.Hour
	DefaultCheckpointEvery    = 256
	DefaultCheckpointInterval = 10 * time.Second
)

func (o *Options) defaults() {
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.MaxFileAge <= 0 {
		o.MaxFileAge = DefaultMaxFileAge
	}
	if o.MaxTotalBytes == 0 {
		o.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if o.RetentionAge == 0 {
		o.RetentionAge = DefaultRetentionAge
	}
	if o.CheckpointEvery == 0 {
		o.CheckpointEvery = DefaultCheckpointEvery
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Log is an open audit log. A nil *Log is a log that is off: Append and
// the front-end hooks do nothing.
type Log struct {
	opt Options

	// qmu guards the queue of appends waiting and who writes them: the
	// first Append to find no writer becomes the writer and writes in its
	// own goroutine (no hand-over to another goroutine, which costs a
	// wake-up on each side on a busy machine); appends that arrive
	// meanwhile queue, and the writer hands the role to the first of them
	// when it has written its own batch (group commit: one write for all
	// of them).
	qmu     sync.Mutex
	queue   []*pending
	writing bool
	closed  bool
	idle    *sync.Cond // signalled when writing ends (Close waits on it)

	// mu guards the file state below, which the writer changes and Verify
	// and Export read (the list of files and how much of the last is
	// durable).
	mu        sync.Mutex
	f         *os.File
	fileName  string
	fileSize  int64  // bytes of records (the durable end)
	fileAlloc int64  // preallocated length (zeros past fileSize)
	zeros     []byte // a segment of zeros (the writer's)
	fileStart time.Time
	seq       uint64 // last durable record
	hash      string // its hash

	cpSeq  uint64    // last checkpointed seq
	cpTime time.Time // and when
	cpBusy atomic.Bool
	cpWG   sync.WaitGroup

	failures atomic.Uint64

	// verified is the outcome of the last Verify; stopVerify and verifyWG
	// end the periodic verification (Options.VerifyInterval) at Close.
	verified   atomic.Pointer[Verification]
	stopVerify chan struct{}
	verifyWG   sync.WaitGroup
}

// Verification is the outcome of a Verify of the live log.
type Verification struct {
	// OK is the report's: every record verified.
	OK bool
	// At is when the verification ended.
	At time.Time
}

type pending struct {
	rec Record
	err error
	// done is closed when the record is written (err says how), or when
	// this append is made the writer (lead).
	done chan struct{}
	lead bool
}

// fileName of the file whose first record is seq.
func fileNameOf(seq uint64) string { return fmt.Sprintf("audit-%020d.jsonl", seq) }

// files lists the log's files, oldest first.
func files(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, "audit-") && strings.HasSuffix(n, ".jsonl") && e.Type().IsRegular() {
			out = append(out, n)
		}
	}
	slices.Sort(out) // zero-padded seq: name order is chain order
	return out, nil
}

// Open opens (creating it if need be) the log in opt.Dir and starts its
// writer. A torn last line — a write a crash interrupted, never
// acknowledged — is cut off with a warning.
func Open(opt Options) (*Log, error) {
	opt.defaults()
	if opt.Dir == "" {
		return nil, errdefs.Invalidf("audit.dir: empty")
	}
	if err := os.MkdirAll(opt.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit.dir: %w", err)
	}
	l := &Log{opt: opt, hash: zeroHash}
	l.idle = sync.NewCond(&l.qmu)
	names, err := files(opt.Dir)
	if err != nil {
		return nil, fmt.Errorf("audit.dir: %w", err)
	}
	// The chain continues from the newest whole record; an empty newest
	// file (a rotation a crash interrupted) is dropped.
	for len(names) > 0 {
		last := names[len(names)-1]
		rec, size, err := l.recoverTail(filepath.Join(opt.Dir, last))
		if err != nil {
			return nil, err
		}
		if rec == nil {
			if err := os.Remove(filepath.Join(opt.Dir, last)); err != nil {
				return nil, fmt.Errorf("audit: remove empty %s: %w", last, err)
			}
			names = names[:len(names)-1]
			continue
		}
		l.seq, l.hash = rec.Seq, rec.Hash
		if size < opt.MaxFileBytes {
			f, err := openSegment(filepath.Join(opt.Dir, last), 0)
			if err != nil {
				return nil, fmt.Errorf("audit: %w", err)
			}
			l.f, l.fileName, l.fileSize, l.fileAlloc = f, last, size, size
			l.fileStart = firstTime(filepath.Join(opt.Dir, last), rec.Time)
		}
		break
	}
	l.cpSeq, l.cpTime = l.seq, opt.Now()
	l.stopVerify = make(chan struct{})
	if opt.VerifyInterval > 0 {
		l.verifyWG.Add(1)
		go l.verifyEvery(opt.VerifyInterval)
	}
	return l, nil
}

// verifyEvery verifies the log at once and then every interval until Close, so that a chain
// edited on disk is noticed (and alerted on, through the metric) without
// anyone running "sandboxctl audit verify".
func (l *Log) verifyEvery(interval time.Duration) {
	defer l.verifyWG.Done()
	t := time.NewTimer(0) // at start, then every interval
	defer t.Stop()
	for {
		select {
		case <-l.stopVerify:
			return
		case <-t.C:
		}
		// The context bounds the checkpoints' read; the files' scan is
		// not cancellable, and Close waits for it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		rep, err := l.Verify(ctx)
		cancel()
		switch {
		case err != nil:
			l.opt.Log.Warn("audit: periodic verification", "err", err)
		case !rep.OK:
			l.opt.Log.Error("audit: the chain does not verify", "problem", rep.Problem)
		}
		t.Reset(interval)
	}
}

// LastVerification is the outcome of the last Verify that produced a
// report; false when none has.
func (l *Log) LastVerification() (Verification, bool) {
	if l == nil {
		return Verification{}, false
	}
	v := l.verified.Load()
	if v == nil {
		return Verification{}, false
	}
	return *v, true
}

// firstTime is the time of a file's first record (for rotation by age);
// fallback when it cannot be read.
func firstTime(path string, fallback time.Time) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return fallback
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadBytes('\n')
	if err != nil {
		return fallback
	}
	var r Record
	if json.Unmarshal(line, &r) != nil {
		return fallback
	}
	return r.Time
}

// recoverTail cuts a torn last line off path and returns its last whole
// record (nil if it has none) and its size after the cut.
func (l *Log) recoverTail(path string) (*Record, int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("audit: %w", err)
	}
	// A file the daemon did not close ends in its preallocated zeros.
	end := len(bytes.TrimRight(data, "\x00"))
	whole := bytes.LastIndexByte(data[:end], '\n') + 1
	if whole < len(data) {
		if whole < end {
			l.opt.Log.Warn("audit: cutting a torn last line (a write interrupted by a crash, never acknowledged)",
				"file", path, "bytes", end-whole)
		}
		if err := os.Truncate(path, int64(whole)); err != nil {
			return nil, 0, fmt.Errorf("audit: cut torn line of %s: %w", path, err)
		}
		data = data[:whole]
	}
	if whole == 0 {
		return nil, 0, nil
	}
	start := bytes.LastIndexByte(data[:whole-1], '\n') + 1
	rec, err := parseLine(data[start : whole-1])
	if err != nil {
		return nil, 0, fmt.Errorf("audit: the last record of %s does not verify (%v): run `sandboxctl audit verify --dir %s`", path, err, filepath.Dir(path))
	}
	return rec, int64(whole), nil
}

// Append writes rec (its Seq, Prev and Hash are assigned here; a zero Time
// is now) and returns once it is on disk. The caller answers its client
// only after Append returned.
func (l *Log) Append(rec Record) error {
	if l == nil {
		return nil
	}
	if rec.Time.IsZero() {
		rec.Time = l.opt.Now()
	}
	rec.Time = rec.Time.UTC()
	p := &pending{rec: rec, done: make(chan struct{})}
	l.qmu.Lock()
	if l.closed {
		l.qmu.Unlock()
		return errdefs.Unavailablef("audit log: closed")
	}
	l.queue = append(l.queue, p)
	lead := !l.writing
	l.writing = true
	l.qmu.Unlock()
	if !lead {
		<-p.done
		lead = p.lead
	}
	if lead {
		l.lead()
	}
	if p.err != nil {
		l.failures.Add(1)
		l.opt.Log.Error("audit: append failed", "action", rec.Action, "err", p.err)
	}
	return p.err
}

// maxBatch bounds one group commit.
const maxBatch = 256

// lead is the writer's turn: it takes the appends queued (its own first),
// chains them in arrival order, writes them in one write and releases
// their callers; then it hands the role to the first append that queued
// meanwhile, or ends it.
func (l *Log) lead() {
	l.qmu.Lock()
	n := min(len(l.queue), maxBatch)
	batch := slices.Clone(l.queue[:n])
	l.queue = slices.Delete(l.queue, 0, n)
	l.qmu.Unlock()

	l.commit(batch)

	l.qmu.Lock()
	if len(l.queue) > 0 {
		next := l.queue[0]
		next.lead = true
		close(next.done)
	} else {
		l.writing = false
		l.idle.Broadcast()
	}
	l.qmu.Unlock()
}

// commit writes one batch and releases its callers (not the writer's own
// record's caller: it is the one running).
func (l *Log) commit(batch []*pending) {
	var buf []byte
	err := l.prepare(batch[0].rec.Time)
	seq, hash := l.seq, l.hash
	if err == nil {
		for _, p := range batch {
			seq++
			p.rec.Seq, p.rec.Prev = seq, hash
			line, e := p.rec.encode()
			if e != nil {
				err = e
				break
			}
			hash = p.rec.Hash
			buf = append(append(buf, line...), '\n')
		}
	}
	if err == nil {
		err = l.write(buf)
	}
	if err == nil {
		l.mu.Lock()
		l.seq, l.hash = seq, hash
		l.fileSize += int64(len(buf))
		l.mu.Unlock()
	}
	for i, p := range batch {
		p.err = err
		if i > 0 {
			close(p.done)
		}
	}
	if err == nil {
		l.maybeCheckpoint(false)
	}
}

// segmentBytes is how much of a file is preallocated at a time: one
// journalled size change per segment instead of per batch.
const segmentBytes = 1 << 20

// openSegment opens a log file for O_DSYNC positional writes: a write
// returns once its data, and whatever metadata reading it back needs, is
// on disk.
func openSegment(path string, flag int) (*os.File, error) {
	return os.OpenFile(path, flag|os.O_WRONLY|unix.O_DSYNC|unix.O_CLOEXEC, 0o600)
}

// write writes buf after the file's records and returns once it is
// durable. A failed or short write is zeroed back out, so that the file
// never holds a half-written, unacknowledged batch that later records
// would chain after.
func (l *Log) write(buf []byte) error {
	if err := l.preallocate(l.fileSize + int64(len(buf))); err != nil {
		return err
	}
	n, err := l.f.WriteAt(buf, l.fileSize)
	if err != nil {
		if n > 0 {
			_, _ = l.f.WriteAt(make([]byte, n), l.fileSize)
		}
		return fmt.Errorf("audit: write %s: %w", l.fileName, err)
	}
	return nil
}

// preallocate makes the file at least need bytes long, a segment at a
// time, by writing zeros (O_DSYNC: durable, size and blocks, when the
// write returns). Written zeros rather than fallocate: an fallocated range
// is unwritten extents, and the first record written into each block
// converts one, a metadata change the filesystem journals — and a journal
// commit waits for whatever else the daemon has just changed on that
// filesystem (measured: +0.1 to 0.2 ms per exec under load). Overwriting
// written blocks changes no metadata at all.
func (l *Log) preallocate(need int64) error {
	if need <= l.fileAlloc {
		return nil
	}
	// A segment, but not much past the size the file rotates at.
	alloc := max(l.fileAlloc+min(segmentBytes, l.opt.MaxFileBytes), need)
	if int64(len(l.zeros)) < alloc-l.fileAlloc {
		l.zeros = make([]byte, alloc-l.fileAlloc)
	}
	if _, err := l.f.WriteAt(l.zeros[:alloc-l.fileAlloc], l.fileAlloc); err != nil {
		return fmt.Errorf("audit: preallocate %s: %w", l.fileName, err)
	}
	l.fileAlloc = alloc
	return nil
}

// closeFile cuts the current file to its records (a closed file holds no
// zeros) and closes it.
func (l *Log) closeFile() error {
	err := l.f.Truncate(l.fileSize)
	if err == nil {
		err = unix.Fdatasync(int(l.f.Fd()))
	}
	if e := l.f.Close(); err == nil {
		err = e
	}
	if err != nil {
		return fmt.Errorf("audit: close %s: %w", l.fileName, err)
	}
	return nil
}

// prepare rotates (and applies retention) when the current file is full or
// old, and opens a file when there is none. now is the batch's time.
func (l *Log) prepare(now time.Time) error {
	if l.f != nil && l.fileSize < l.opt.MaxFileBytes && now.Sub(l.fileStart) < l.opt.MaxFileAge {
		return nil
	}
	if l.f != nil {
		if err := l.closeFile(); err != nil {
			return err
		}
		l.mu.Lock()
		l.f = nil
		l.mu.Unlock()
		l.maybeCheckpoint(true) // the last record of the full file
	}
	name := fileNameOf(l.seq + 1)
	f, err := openSegment(filepath.Join(l.opt.Dir, name), os.O_CREATE)
	if err != nil {
		return fmt.Errorf("audit: create %s: %w", name, err)
	}
	// The new name must survive a crash before records go into it.
	if d, err := os.Open(l.opt.Dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	l.mu.Lock()
	l.f, l.fileName, l.fileSize, l.fileAlloc, l.fileStart = f, name, 0, 0, now
	l.mu.Unlock()
	l.retain(now)
	return nil
}

// retain deletes the oldest files (never the current one) beyond the total
// size or older than the retention age, and their checkpoints.
func (l *Log) retain(now time.Time) {
	names, err := files(l.opt.Dir)
	if err != nil {
		l.opt.Log.Warn("audit: retention: list", "err", err)
		return
	}
	type fi struct {
		name string
		size int64
		mod  time.Time
	}
	var all []fi
	var total int64
	for _, n := range names {
		st, err := os.Stat(filepath.Join(l.opt.Dir, n))
		if err != nil {
			continue
		}
		size := st.Size()
		if n == l.fileName {
			size = l.fileSize // not its preallocated zeros
		}
		all = append(all, fi{n, size, st.ModTime()})
		total += size
	}
	removed := 0
	for _, f := range all {
		if f.name == l.fileName {
			break
		}
		tooBig := l.opt.MaxTotalBytes > 0 && total > l.opt.MaxTotalBytes
		tooOld := l.opt.RetentionAge > 0 && now.Sub(f.mod) > l.opt.RetentionAge
		if !tooBig && !tooOld {
			break // oldest first: keep the rest whole, the chain has no holes
		}
		if err := os.Remove(filepath.Join(l.opt.Dir, f.name)); err != nil {
			l.opt.Log.Warn("audit: retention: remove", "file", f.name, "err", err)
			break
		}
		total -= f.size
		removed++
		l.opt.Log.Info("audit: retention removed a file", "file", f.name, "too_big", tooBig, "too_old", tooOld)
	}
	if removed == 0 || l.opt.Checkpoints == nil {
		return
	}
	if rest, err := files(l.opt.Dir); err == nil && len(rest) > 0 {
		if first, ok := seqOfName(rest[0]); ok {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := l.opt.Checkpoints.DeleteAuditCheckpointsBefore(ctx, first); err != nil {
				l.opt.Log.Warn("audit: retention: checkpoints", "err", err)
			}
		}
	}
}

func seqOfName(n string) (uint64, bool) {
	s, ok := strings.CutPrefix(n, "audit-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".jsonl")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// maybeCheckpoint stores the newest record's hash when enough records or
// time have passed (or force), in the background: the database is not on
// the path of an answer.
func (l *Log) maybeCheckpoint(force bool) {
	if l.opt.Checkpoints == nil {
		return
	}
	l.mu.Lock()
	seq, hash := l.seq, l.hash
	l.mu.Unlock()
	now := l.opt.Now()
	if seq == l.cpSeq || !force && seq-l.cpSeq < l.opt.CheckpointEvery && now.Sub(l.cpTime) < l.opt.CheckpointInterval {
		return
	}
	if !l.cpBusy.CompareAndSwap(false, true) {
		return // one at a time; the next batch tries again
	}
	l.cpSeq, l.cpTime = seq, now
	l.cpWG.Add(1)
	go func() {
		defer l.cpWG.Done()
		defer l.cpBusy.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.opt.Checkpoints.SaveAuditCheckpoint(ctx, Checkpoint{Seq: seq, Hash: hash, At: now}); err != nil {
			l.opt.Log.Warn("audit: checkpoint", "seq", seq, "err", err)
		}
	}()
}

// Failures counts appends that failed (for metrics).
func (l *Log) Failures() uint64 {
	if l == nil {
		return 0
	}
	return l.failures.Load()
}

// Dir is the log's directory.
func (l *Log) Dir() string { return l.opt.Dir }

// Close waits for appends in flight, stores a last checkpoint and closes
// the file. Appends after Close fail.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.qmu.Lock()
	if l.closed {
		l.qmu.Unlock()
		return nil
	}
	l.closed = true // no append queues any more
	for l.writing {
		l.idle.Wait()
	}
	l.qmu.Unlock()
	close(l.stopVerify)
	l.verifyWG.Wait()
	l.cpWG.Wait()
	l.maybeCheckpoint(true)
	l.cpWG.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		err := l.closeFile()
		l.f = nil
		return err
	}
	return nil
}

// state is what Verify and Export read of the live log: its files and how
// much of the last one is durable.
func (l *Log) state() (names []string, durableSeq uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	names, err = files(l.opt.Dir)
	return names, l.seq, err
}

// errStop ends a scan early.
var errStop = errors.New("stop")

// scanLines calls fn for each line of the files in order (without its
// newline; torn is true for a last line of the last file that has none).
// The zeros a file was preallocated with end it: a file the daemon still
// writes, or one a crash left, holds its records, maybe a torn line, then
// nothing but zeros; anything else after the zeros is a line like any
// other (and no record).
func scanLines(dir string, names []string, fn func(file string, line int, b []byte, torn bool) error) error {
	for i, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		r := bufio.NewReaderSize(f, 64<<10)
		for ln := 1; ; ln++ {
			b, err := r.ReadBytes('\n')
			if len(b) == 0 && err == io.EOF {
				break
			}
			if err != nil && err != io.EOF {
				f.Close()
				return err
			}
			torn := err == io.EOF // no newline
			if !torn {
				b = b[:len(b)-1]
			} else if b = bytes.TrimRight(b, "\x00"); len(b) == 0 {
				break // the preallocated end
			}
			if e := fn(n, ln, b, torn && i == len(names)-1); e != nil {
				f.Close()
				return e
			}
			if torn {
				break
			}
		}
		f.Close()
	}
	return nil
}
