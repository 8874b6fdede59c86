package apitypes

// AuditReport is the answer of GET /v1/audit/verify and `sandboxctl audit
// verify`: whether the audit log's hash chain (and its checkpoints in the
// state database) hold, and if not, the first record at fault.
type AuditReport struct {
	// OK is true when every record verified.
	OK bool `json:"ok"`
	// Files and Records are how many were read.
	Files   int    `json:"files"`
	Records uint64 `json:"records"`
	// FirstSeq and LastSeq are the first and last record verified; the log
	// begins after 1 when retention removed older files.
	FirstSeq uint64 `json:"first_seq,omitempty"`
	LastSeq  uint64 `json:"last_seq,omitempty"`
	// LastHash is the hash of the last record verified: write it down, and a
	// later verify that passes shows the log still holds it.
	LastHash string `json:"last_hash,omitempty"`
	// Checkpoints is how many checkpoints of the state database were
	// compared (zero when verifying a copy with --dir).
	Checkpoints int `json:"checkpoints"`
	// TornTail is true when the last line was incomplete (a write a crash
	// interrupted, never acknowledged): it is ignored.
	TornTail bool `json:"torn_tail,omitempty"`
	// Problem is the first record at fault; nil when OK.
	Problem *AuditProblem `json:"problem,omitempty"`
}

// AuditProblem names the first record at fault in the audit log.
type AuditProblem struct {
	// Kind is edited, removed, inserted or reordered.
	Kind string `json:"kind"`
	// Seq is the sequence number of the record named.
	Seq uint64 `json:"seq"`
	// File and Line are where the fault was found.
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}
