package audit

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

// OCSF (Open Cybersecurity Schema Framework) API Activity, class 6003 of
// the Application Activity category: the form `audit export` writes, so
// that a SIEM ingests the log without a custom parser. Only the names and
// enumerations of the schema are used; what it has no attribute for (the
// chain's hashes, the admin flag) goes under unmapped, as it asks.
const (
	ocsfVersion      = "1.3.0"
	ocsfClassUID     = 6003
	ocsfCategoryUID  = 6
	ocsfStatusOK     = 1
	ocsfStatusFailed = 2
)

// OCSF activity ids of API Activity.
const (
	activityCreate = 1
	activityUpdate = 3
	activityDelete = 4
	activityOther  = 99
)

var activityNames = map[int]string{activityCreate: "Create", activityUpdate: "Update", activityDelete: "Delete", activityOther: "Other"}

// OCSFEvent is one exported record.
type OCSFEvent struct {
	ClassUID     int           `json:"class_uid"`
	ClassName    string        `json:"class_name"`
	CategoryUID  int           `json:"category_uid"`
	CategoryName string        `json:"category_name"`
	ActivityID   int           `json:"activity_id"`
	ActivityName string        `json:"activity_name"`
	TypeUID      int           `json:"type_uid"`
	TypeName     string        `json:"type_name"`
	Time         int64         `json:"time"` // ms since the epoch
	SeverityID   int           `json:"severity_id"`
	Severity     string        `json:"severity"`
	StatusID     int           `json:"status_id"`
	Status       string        `json:"status"`
	StatusCode   string        `json:"status_code,omitempty"`
	Actor        ocsfActor     `json:"actor"`
	API          ocsfAPI       `json:"api"`
	SrcEndpoint  *ocsfEndpoint `json:"src_endpoint,omitempty"`
	Resources    []ocsfRes     `json:"resources,omitempty"`
	HTTPResponse *ocsfHTTP     `json:"http_response,omitempty"`
	Metadata     ocsfMetadata  `json:"metadata"`
	Unmapped     ocsfUnmapped  `json:"unmapped"`
}

type ocsfActor struct {
	User ocsfUser `json:"user"`
}

type ocsfUser struct {
	UID    string `json:"uid,omitempty"`
	Name   string `json:"name,omitempty"`
	TypeID int    `json:"type_id"` // 1 user, 2 admin
	Type   string `json:"type"`
}

type ocsfAPI struct {
	Operation string      `json:"operation"`
	Service   ocsfService `json:"service"`
}

type ocsfService struct {
	Name string `json:"name"`
}

type ocsfEndpoint struct {
	IP   string `json:"ip,omitempty"`
	Port int    `json:"port,omitempty"`
	Name string `json:"name,omitempty"`
}

type ocsfRes struct {
	UID string `json:"uid"`
}

type ocsfHTTP struct {
	Code int `json:"code"`
}

type ocsfMetadata struct {
	Version   string      `json:"version"`
	Product   ocsfProduct `json:"product"`
	UID       string      `json:"uid"`
	Sequence  uint64      `json:"sequence"`
	TenantUID string      `json:"tenant_uid,omitempty"`
}

type ocsfProduct struct {
	Name       string `json:"name"`
	VendorName string `json:"vendor_name"`
	Version    string `json:"version"`
}

type ocsfUnmapped struct {
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
}

// activityOf classifies an action: REST and E2B actions by method and
// route, MCP tools by name.
func activityOf(action string) int {
	method, route, _ := strings.Cut(action, " ")
	switch method {
	case "DELETE":
		return activityDelete
	case "PUT", "PATCH":
		return activityUpdate
	case "POST":
		// A POST to a collection (its last segment a plural noun, not a
		// verb like exec) creates.
		last := route[strings.LastIndexByte(route, '/')+1:]
		switch last {
		case "sandboxes", "jobs", "snapshots", "vms", "ports", "login-tokens", "volumes", "keys":
			return activityCreate
		}
		return activityOther
	}
	if tool, ok := strings.CutPrefix(action, "mcp:"); ok {
		switch {
		case strings.Contains(tool, "create"):
			return activityCreate
		case strings.Contains(tool, "terminate"), strings.Contains(tool, "delete"), strings.Contains(tool, "remove"), strings.Contains(tool, "kill"):
			return activityDelete
		case strings.Contains(tool, "write"), strings.Contains(tool, "upload"):
			return activityUpdate
		}
	}
	return activityOther
}

// OCSF returns r as an OCSF API Activity event.
func (r *Record) OCSF() OCSFEvent {
	act := activityOf(r.Action)
	ev := OCSFEvent{
		ClassUID: ocsfClassUID, ClassName: "API Activity", CategoryUID: ocsfCategoryUID, CategoryName: "Application Activity",
		ActivityID: act, ActivityName: activityNames[act], TypeUID: ocsfClassUID*100 + act,
		TypeName: "API Activity: " + activityNames[act], Time: r.Time.UnixMilli(),
		SeverityID: 1, Severity: "Informational",
		StatusID: ocsfStatusOK, Status: "Success", StatusCode: r.Code,
		Actor: ocsfActor{User: ocsfUser{UID: r.KeyID, Name: r.KeyName, TypeID: 1, Type: "User"}},
		API:   ocsfAPI{Operation: r.Action, Service: ocsfService{Name: r.FrontEnd}},
		Metadata: ocsfMetadata{Version: ocsfVersion, UID: r.Hash, Sequence: r.Seq, TenantUID: r.Tenant,
			Product: ocsfProduct{Name: "mcp-sandboxd", VendorName: "SandboxRunner", Version: version.Version}},
		Unmapped: ocsfUnmapped{PrevHash: r.Prev, Hash: r.Hash},
	}
	if r.Admin {
		ev.Actor.User.TypeID, ev.Actor.User.Type = 2, "Admin"
	}
	if r.Outcome != Success {
		ev.StatusID, ev.Status = ocsfStatusFailed, "Failure"
	}
	if r.Source != "" {
		if host, port, err := net.SplitHostPort(r.Source); err == nil {
			p, _ := strconv.Atoi(port)
			ev.SrcEndpoint = &ocsfEndpoint{IP: host, Port: p}
		} else {
			ev.SrcEndpoint = &ocsfEndpoint{Name: r.Source}
		}
	}
	if r.Target != "" {
		ev.Resources = []ocsfRes{{UID: r.Target}}
	}
	if r.Status != 0 {
		ev.HTTPResponse = &ocsfHTTP{Code: r.Status}
	}
	return ev
}

// Export writes the records from since on (zero: all) as OCSF JSON lines.
// Records that do not verify are written as they parse; verify says which.
func (l *Log) Export(ctx context.Context, since time.Time, w io.Writer) (int, error) {
	names, durable, err := l.state()
	if err != nil {
		return 0, err
	}
	return export(ctx, l.opt.Dir, names, durable, since, w)
}

func export(ctx context.Context, dir string, names []string, upTo uint64, since time.Time, w io.Writer) (int, error) {
	enc := json.NewEncoder(w)
	n := 0
	err := scanLines(dir, names, func(_ string, _ int, b []byte, torn bool) error {
		if torn {
			return errStop
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var r Record
		if json.Unmarshal(b, &r) != nil {
			return nil
		}
		if upTo > 0 && r.Seq > upTo {
			return errStop
		}
		if r.Time.Before(since) {
			return nil
		}
		n++
		return enc.Encode(r.OCSF())
	})
	if err == errStop {
		err = nil
	}
	return n, err
}

// ExportDir is Export of the log files in dir (a copy, or a stopped
// daemon's).
func ExportDir(ctx context.Context, dir string, since time.Time, w io.Writer) (int, error) {
	names, err := files(dir)
	if err != nil {
		return 0, err
	}
	return export(ctx, dir, names, 0, since, w)
}

// ParseSince reads export's since: an RFC 3339 time, or a duration back
// from now ("24h"); empty is the beginning.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, errdefs.Invalidf("since: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration back from now (24h), got %q", s)
}
