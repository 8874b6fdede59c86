package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Kinds of AuditProblem.
const (
	Edited    = "edited"
	Removed   = "removed"
	Inserted  = "inserted"
	Reordered = "reordered"
)

// parseLine checks one line: strict JSON of a Record, canonical (exactly
// what encoding its fields gives, so no byte can change without the hash
// or the form breaking), hash right.
func parseLine(b []byte) (*Record, error) {
	if len(b) <= hashSuffixLen || !bytes.HasPrefix(b[len(b)-hashSuffixLen:], []byte(`,"hash":"`)) || !bytes.HasSuffix(b, []byte(`"}`)) {
		return nil, errors.New("not an audit record (no hash at its end)")
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("not an audit record: %v", err)
	}
	if dec.More() {
		return nil, errors.New("not an audit record: data after the object")
	}
	re := r
	line, err := re.encode()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(line, b) {
		if re.Hash != r.Hash {
			return nil, errors.New("its hash does not match its content")
		}
		return nil, errors.New("not in canonical form")
	}
	return &r, nil
}

// lenientSeq is the seq field of a line that may not verify (0 if none).
func lenientSeq(b []byte) uint64 {
	var r struct {
		Seq uint64 `json:"seq"`
	}
	_ = json.Unmarshal(b, &r)
	return r.Seq
}

// Verify checks the live log: its hash chain up to the last durable record
// and the checkpoints of the state database.
func (l *Log) Verify(ctx context.Context) (*apitypes.AuditReport, error) {
	names, durable, err := l.state()
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	var cps []Checkpoint
	if l.opt.Checkpoints != nil {
		if cps, err = l.opt.Checkpoints.AuditCheckpoints(ctx); err != nil {
			return nil, fmt.Errorf("audit: read checkpoints: %w", err)
		}
	}
	rep, err := verify(l.opt.Dir, names, durable, cps)
	if err == nil {
		l.verified.Store(&Verification{OK: rep.OK, At: l.opt.Now()})
	}
	return rep, err
}

// VerifyDir checks the log files in dir (a copy, or the log of a daemon
// that is not running) against cps (nil: the chain alone).
func VerifyDir(dir string, cps []Checkpoint) (*apitypes.AuditReport, error) {
	names, err := files(dir)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: no audit-*.jsonl files", dir)
	}
	return verify(dir, names, 0, cps)
}

// verify walks the chain. upTo > 0 stops after that record (a live log's
// newer lines may be half written). The first fault ends the walk; a seq
// out of place is told apart by looking ahead for the record that belongs
// there: found later, the records were reordered; not found, removed.
func verify(dir string, names []string, upTo uint64, cps []Checkpoint) (*apitypes.AuditReport, error) {
	w := &chainWalk{dir: dir, names: names, upTo: upTo, rep: &apitypes.AuditReport{Files: len(names)},
		cp: map[uint64]string{}, fileOf: map[string]uint64{}}
	for _, c := range cps {
		w.cp[c.Seq] = c.Hash
	}
	err := scanLines(dir, names, w.line)
	if err != nil && !errors.Is(err, errStop) {
		return nil, fmt.Errorf("audit: read: %w", err)
	}
	rep := w.rep
	if rep.Problem == nil {
		rep.Problem = checkpointsOutside(rep, cps, upTo)
	}
	rep.OK = rep.Problem == nil
	return rep, nil
}

// chainWalk is one verify's walk over the log's lines.
type chainWalk struct {
	dir    string
	names  []string
	upTo   uint64
	rep    *apitypes.AuditReport
	cp     map[uint64]string // checkpoints: seq → hash
	expect uint64            // 0: before the first record
	prev   string
	pos    int               // global line index
	fileOf map[string]uint64 // file → its first record's seq
}

// fail records the walk's problem and stops it.
func (w *chainWalk) fail(kind string, seq uint64, file string, line int, format string, args ...any) error {
	w.rep.Problem = &apitypes.AuditProblem{Kind: kind, Seq: seq, File: file, Line: line, Message: fmt.Sprintf(format, args...)}
	return errStop
}

// findLater looks for a record seq after global position after.
func (w *chainWalk) findLater(seq uint64, after int) (file string, line int, ok bool) {
	i := 0
	_ = scanLines(w.dir, w.names, func(f string, ln int, b []byte, torn bool) error {
		i++
		if i > after && !torn && lenientSeq(b) == seq {
			file, line, ok = f, ln, true
			return errStop
		}
		return nil
	})
	return file, line, ok
}

// line checks one line of the log (scanLines' callback).
func (w *chainWalk) line(file string, ln int, b []byte, torn bool) error {
	w.pos++
	if w.upTo > 0 && w.expect > w.upTo {
		return errStop
	}
	if torn {
		w.rep.TornTail = true
		return errStop
	}
	rec, perr := parseLine(b)
	if perr != nil {
		seq := w.expect
		if seq == 0 {
			seq = lenientSeq(b)
		}
		if s := lenientSeq(b); s != 0 && s < w.expect {
			return w.fail(Inserted, s, file, ln, "%s:%d is not a valid record (%v) and claims seq %d, which came already", file, ln, perr, s)
		}
		return w.fail(Edited, seq, file, ln, "record %d (%s:%d) was edited: %v", seq, file, ln, perr)
	}
	if err := w.checkStart(rec, file, ln); err != nil {
		return err
	}
	if err := w.checkOrder(rec, file, ln); err != nil {
		return err
	}
	if h, ok := w.cp[rec.Seq]; ok {
		w.rep.Checkpoints++
		if h != rec.Hash {
			return w.fail(Edited, rec.Seq, file, ln, "record %d (%s:%d) differs from its checkpoint in the state database: the chain was rewritten from here or before", rec.Seq, file, ln)
		}
	}
	w.prev = rec.Hash
	w.rep.LastSeq, w.rep.LastHash = rec.Seq, rec.Hash
	w.rep.Records++
	w.expect++
	return nil
}

// checkStart checks a file's first record against the file's name, and
// the log's first record (a chain starts at record 1 with no prev hash, or
// wherever retention left it).
func (w *chainWalk) checkStart(rec *Record, file string, ln int) error {
	if _, seen := w.fileOf[file]; !seen {
		w.fileOf[file] = rec.Seq
		if want, ok := seqOfName(file); ok && want != rec.Seq && rec.Seq == w.expect {
			// A file renamed or merged: its name says where it starts.
			return w.fail(Edited, rec.Seq, file, ln, "%s begins with record %d, its name says %d", file, rec.Seq, want)
		}
	}
	if w.expect == 0 {
		w.expect, w.prev = rec.Seq, rec.Prev
		w.rep.FirstSeq = rec.Seq
		if rec.Seq == 1 && rec.Prev != zeroHash {
			return w.fail(Edited, 1, file, ln, "record 1 (%s:%d) has a prev hash, the first record has none", file, ln)
		}
	}
	return nil
}

// checkOrder checks that rec is the record expected next and chains to
// the one before, and names what happened when it is not.
func (w *chainWalk) checkOrder(rec *Record, file string, ln int) error {
	expect := w.expect
	switch {
	case rec.Seq == expect && rec.Prev == w.prev:
		return nil
	case rec.Seq == expect:
		if f, l, ok := w.findLater(expect, w.pos); ok {
			return w.fail(Inserted, expect, file, ln, "%s:%d is a record %d that does not chain to record %d; another record %d follows at %s:%d (one of them was inserted)", file, ln, expect, expect-1, expect, f, l)
		}
		return w.fail(Edited, expect-1, file, ln, "record %d does not chain to record %d (%s:%d): record %d was rewritten", expect, expect-1, file, ln, expect-1)
	case rec.Seq < expect:
		return w.fail(Inserted, rec.Seq, file, ln, "%s:%d holds record %d again where record %d belongs: a line was inserted", file, ln, rec.Seq, expect)
	default: // rec.Seq > expect
		if f, l, ok := w.findLater(expect, w.pos); ok {
			return w.fail(Reordered, expect, file, ln, "record %d is out of order: record %d is at %s:%d where it belongs, record %d comes later at %s:%d", expect, rec.Seq, file, ln, expect, f, l)
		}
		if rec.Seq == expect+1 {
			return w.fail(Removed, expect, file, ln, "record %d was removed (record %d follows record %d at %s:%d)", expect, rec.Seq, expect-1, file, ln)
		}
		return w.fail(Removed, expect, file, ln, "records %d to %d were removed (record %d follows record %d at %s:%d)", expect, rec.Seq-1, rec.Seq, expect-1, file, ln)
	}
}

// checkpointsOutside is the problem of a checkpoint the walked chain does
// not reach: records before the log's first or after its last were
// removed (nil when every checkpoint is inside).
func checkpointsOutside(rep *apitypes.AuditReport, cps []Checkpoint, upTo uint64) *apitypes.AuditProblem {
	for _, c := range cps {
		switch {
		case rep.Records > 0 && c.Seq < rep.FirstSeq:
			return &apitypes.AuditProblem{Kind: Removed, Seq: c.Seq, Message: fmt.Sprintf(
				"the log begins at record %d but the state database holds a checkpoint of record %d: records up to %d were removed (retention removes checkpoints with its files)", rep.FirstSeq, c.Seq, rep.FirstSeq-1)}
		case c.Seq > rep.LastSeq && (upTo == 0 || c.Seq <= upTo):
			return &apitypes.AuditProblem{Kind: Removed, Seq: rep.LastSeq + 1, Message: fmt.Sprintf(
				"the log ends at record %d but the state database holds a checkpoint of record %d: the records after %d were removed", rep.LastSeq, c.Seq, rep.LastSeq)}
		}
	}
	return nil
}
