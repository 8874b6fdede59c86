package config

import (
	"testing"
	"time"
)

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in      string
		want    ByteSize
		wantErr string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512M", want: 512 << 20},
		{in: "512m", want: 512 << 20},
		{in: "64KiB", want: 64 << 10},
		{in: "64KB", want: 64 << 10},
		{in: "1G", want: 1 << 30},
		{in: "2T", want: 2 << 40},
		{in: "1.5G", want: 3 << 29},
		{in: " 8 G ", want: 8 << 30},
		{in: "100B", want: 100},
		{in: "9223372036854775807", want: 1<<63 - 1},
		{in: "12X", wantErr: `invalid size "12X" (use K, M, G, T)`},
		{in: "", wantErr: `invalid size "" (use K, M, G, T)`},
		{in: "G", wantErr: `invalid size "G" (use K, M, G, T)`},
		{in: "-1M", wantErr: `invalid size "-1M" (use K, M, G, T)`},
		{in: "1.2.3M", wantErr: `invalid size "1.2.3M" (use K, M, G, T)`},
		{in: "1iM", wantErr: `invalid size "1iM" (use K, M, G, T)`},
		{in: "9000000T", wantErr: `size "9000000T" is too large`},
		{in: "9000000.5T", wantErr: `size "9000000.5T" is too large`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseByteSize(tt.in)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("ParseByteSize(%q) = %v, %v; want error %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseByteSize(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestByteSizeString(t *testing.T) {
	tests := []struct {
		in   ByteSize
		want string
	}{
		{0, "0"},
		{1000, "1000"},
		{1 << 10, "1K"},
		{1536, "1536"},
		{3 << 29, "1536M"},
		{4 << 30, "4G"},
		{1 << 40, "1T"},
	}
	for _, tt := range tests {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(tt.in), got, tt.want)
		}
		back, err := ParseByteSize(tt.want)
		if err != nil || back != tt.in {
			t.Errorf("ParseByteSize(%q) = %v, %v; want %d", tt.want, back, err, int64(tt.in))
		}
	}
}

func TestDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		str     string // String of the parsed value
		wantErr string
	}{
		{in: "0", want: 0, str: "0"},
		{in: "0s", want: 0, str: "0"},
		{in: "30s", want: 30 * time.Second, str: "30s"},
		{in: "300s", want: 5 * time.Minute, str: "5m"},
		{in: "1h", want: time.Hour, str: "1h"},
		{in: "1h30m", want: 90 * time.Minute, str: "1h30m"},
		{in: "24h", want: 24 * time.Hour, str: "24h"},
		{in: "1m0.5s", want: 60500 * time.Millisecond, str: "1m0.5s"},
		{in: "250ms", want: 250 * time.Millisecond, str: "250ms"},
		{in: "5", wantErr: `invalid duration "5" (use e.g. 30s, 5m, 1h)`},
		{in: "five minutes", wantErr: `invalid duration "five minutes" (use e.g. 30s, 5m, 1h)`},
		{in: "-5m", wantErr: `negative duration "-5m"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			d := Duration(42) // must survive a failed parse
			err := d.UnmarshalText([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr || d != 42 {
					t.Fatalf("UnmarshalText(%q) = %v (d=%v); want error %q and d unchanged", tt.in, err, d, tt.wantErr)
				}
				return
			}
			if err != nil || d.D() != tt.want {
				t.Fatalf("UnmarshalText(%q) = %v, d=%v; want %v", tt.in, err, d.D(), tt.want)
			}
			if got := d.String(); got != tt.str {
				t.Errorf("String() = %q, want %q", got, tt.str)
			}
		})
	}
}
