package apitypes

import "time"

// Quota bounds what the sandboxes of one API key may hold at once and how
// fast it may create them. A zero field is no limit.
type Quota struct {
	// Sandboxes is the number of live sandboxes (VMs included).
	Sandboxes int `json:"sandboxes,omitempty" jsonschema_description:"Live sandboxes (VMs included); 0: no limit."`
	// MemoryMB is the sum of the live sandboxes' memory limits, in MiB.
	MemoryMB int64 `json:"memory_mb,omitempty" jsonschema_description:"Sum of the live sandboxes' memory limits in MiB; 0: no limit."`
	// CPUs is the sum of the live sandboxes' CPU limits.
	CPUs float64 `json:"cpus,omitempty" jsonschema_description:"Sum of the live sandboxes' CPU limits; 0: no limit."`
	// DiskMB is the sum of the live sandboxes' disk limits, in MiB.
	DiskMB int64 `json:"disk_mb,omitempty" jsonschema_description:"Sum of the live sandboxes' disk limits in MiB; 0: no limit."`
	// CreatesPerMinute is the rate of sandbox creates (a token bucket
	// holding a minute's worth).
	CreatesPerMinute int `json:"creates_per_minute,omitempty" jsonschema_description:"Sandbox creates per minute (token bucket); 0: no limit."`
}

// KeyUse is what a key's live sandboxes hold, in the units of Quota.
type KeyUse struct {
	Sandboxes int     `json:"sandboxes"`
	MemoryMB  int64   `json:"memory_mb"`
	CPUs      float64 `json:"cpus"`
	DiskMB    int64   `json:"disk_mb"`
	// CreatesLastMinute is how many creates the key's bucket counts as
	// spent (those of about the last minute; 0 without that quota).
	CreatesLastMinute int `json:"creates_last_minute"`
}

// Key scopes.
const (
	ScopeAdmin = "admin" // every tenant's resources, and the keys
	ScopeUser  = "user"  // its own tenant's resources
)

// Key describes an API key; its secret is shown once, by create and
// rotate (KeySecret), never again.
type Key struct {
	ID     string `json:"key_id"`
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
	Scope  string `json:"scope"`
	Quota  Quota  `json:"quota"`
	// Source is "store" for keys made by keys create, "file" for the keys
	// of server.auth_token_file and e2b.api_key_file (changed by editing
	// the file, not through the API).
	Source     string     `json:"source"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

// KeyCreateRequest is POST /v1/keys.
type KeyCreateRequest struct {
	Name string `json:"name"`
	// Tenant owns what the key creates; default: the key's name.
	Tenant string `json:"tenant,omitempty"`
	Admin  bool   `json:"admin,omitempty"`
	Quota  Quota  `json:"quota,omitempty"`
	// ExpiresIn is the key's lifetime in seconds; 0: it does not expire.
	ExpiresIn int64 `json:"expires_in_seconds,omitempty"`
}

// KeySecret is the answer of create and rotate: the key and its secret,
// which the daemon does not keep and cannot show again.
type KeySecret struct {
	Key
	Secret string `json:"secret"`
}

// KeyUsage is a key's quota and what it uses of it (keys usage, the
// quota_usage tool).
type KeyUsage struct {
	KeyID  string `json:"key_id"`
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
	Quota  Quota  `json:"quota"`
	Use    KeyUse `json:"use"`
}

// KeyList is the body of GET /v1/keys.
type KeyList struct {
	Keys []Key `json:"keys"`
}
