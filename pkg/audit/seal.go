package audit

// Seal numbers r as record seq following the record whose hash is prev
// (64 zeros for the first), and returns its canonical line, without
// newline, with r.Hash set: exactly the line Append would write, for a
// log kept elsewhere than in files (pkg/store/pgstore keeps the fleet's as
// rows of PostgreSQL), which VerifyDir then checks in the same way.
func (r *Record) Seal(seq uint64, prev string) ([]byte, error) {
	r.Seq, r.Prev = seq, prev
	return r.encode()
}

// FileName is the name VerifyDir expects of a log file whose first
// record is seq.
func FileName(seq uint64) string { return fileNameOf(seq) }
