package server

// output is one stream of a job: the absolute number of bytes written so
// far and a tail of the most recent ones. It is guarded by its job's mutex.
type output struct {
	retain int
	// buf holds the bytes from offset start to end. It may grow to twice
	// retain before the front is dropped, which keeps appends amortised
	// O(1); only the last retain bytes are ever served.
	buf   []byte
	start int64
}

func (o *output) end() int64 { return o.start + int64(len(o.buf)) }

// tail returns the oldest offset that is still served.
func (o *output) tail() int64 { return max(o.start, o.end()-int64(o.retain)) }

func (o *output) write(p []byte) {
	o.buf = append(o.buf, p...)
	if len(o.buf) > 2*o.retain {
		drop := len(o.buf) - o.retain
		n := copy(o.buf, o.buf[drop:])
		o.buf = o.buf[:n]
		o.start += int64(drop)
	}
}

// shrink drops everything before the tail, for a stream that will not grow
// any more.
func (o *output) shrink() {
	drop := o.tail() - o.start
	o.buf = append([]byte(nil), o.buf[drop:]...)
	o.start += drop
}

// read returns a copy of up to limit bytes from off and the offset of the
// first byte, which is moved forward to the tail if off is no longer
// retained. An offset beyond the end yields no data and stays put.
func (o *output) read(off int64, limit int) ([]byte, int64) {
	off = max(off, o.tail())
	if off >= o.end() {
		return nil, off
	}
	i := int(off - o.start)
	n := min(len(o.buf)-i, limit)
	return append([]byte(nil), o.buf[i:i+n]...), off
}
