package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// The fleet's API keys through a gateway. The keys a gateway authenticates
// are its tenants store's (the fleet's PostgreSQL): /v1/keys is answered
// here, from that store, not by a node (whose own store holds only its
// local keys). Usage is the fleet's count (FleetStore), the quota the
// key's.

// KeyAdmin manages the fleet's keys (pkg/tenants' Service).
type KeyAdmin interface {
	KeyLookup
	Create(ctx context.Context, req apitypes.KeyCreateRequest) (*apitypes.KeySecret, error)
	Revoke(ctx context.Context, id string) (*apitypes.Key, error)
	Rotate(ctx context.Context, id string) (*apitypes.KeySecret, error)
	List(ctx context.Context) ([]apitypes.Key, error)
}

// keys serves /v1/keys and below; false when the route is not a keys
// route (or there is no KeyAdmin: a node answers, as before).
func (g *Gateway) keys(w http.ResponseWriter, r *http.Request, p principal.Principal) bool {
	ka := g.opt.KeyAdmin
	path := r.URL.Path
	if ka == nil || (path != "/v1/keys" && !strings.HasPrefix(path, "/v1/keys/")) {
		return false
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(path, "/v1/keys"), "/")
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case rest == "" && r.Method == http.MethodGet:
		if g.admin(w, p) {
			l, err := ka.List(r.Context())
			if l == nil {
				l = []apitypes.Key{}
			}
			reply(w, http.StatusOK, apitypes.KeyList{Keys: l}, err)
		}
	case rest == "" && r.Method == http.MethodPost:
		if !g.admin(w, p) {
			return true
		}
		var req apitypes.KeyCreateRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(w, errdefs.LimitExceededf("body: larger than %d bytes", tooBig.Limit))
			} else {
				writeError(w, errdefs.Invalidf("body: %v", err))
			}
			return true
		}
		k, err := ka.Create(r.Context(), req)
		reply(w, http.StatusCreated, k, err)
	case id != "" && action == "revoke" && r.Method == http.MethodPost:
		if g.admin(w, p) {
			k, err := ka.Revoke(r.Context(), id)
			reply(w, http.StatusOK, k, err)
		}
	case id != "" && action == "rotate" && r.Method == http.MethodPost:
		if g.admin(w, p) {
			k, err := ka.Rotate(r.Context(), id)
			reply(w, http.StatusOK, k, err)
		}
	case id != "" && action == "usage" && r.Method == http.MethodGet:
		g.keyUsage(w, r, p, id)
	default:
		writeError(w, errdefs.NotFoundf("%s %s: no such keys route", r.Method, path))
	}
	return true
}

// keyUsage is GET /v1/keys/{id}/usage: KeyUsage of the caller.
func (g *Gateway) keyUsage(w http.ResponseWriter, r *http.Request, p principal.Principal, id string) {
	u, err := g.KeyUsage(r.Context(), p, id)
	reply(w, http.StatusOK, u, err)
}

// KeyUsage is key id's quota and its use counted across the fleet, as p
// may see it: an admin any key's, a user its own ("self" or "": p's). It
// answers GET /v1/keys/{id}/usage and the MCP quota_usage tool alike.
func (g *Gateway) KeyUsage(ctx context.Context, p principal.Principal, id string) (*apitypes.KeyUsage, error) {
	if id == "self" || id == "" {
		id = p.KeyID
	}
	var keys KeyLookup = g.opt.Keys
	if g.opt.KeyAdmin != nil {
		keys = g.opt.KeyAdmin
	}
	if keys == nil {
		return nil, errdefs.Unavailablef("key_id: this gateway has no keys store")
	}
	if id == "" {
		// The gateway's own secret, or an admin without a key record.
		return nil, errdefs.Invalidf("key_id: required (the caller has no key of its own)")
	}
	if !p.Admin && id != p.KeyID {
		return nil, errdefs.NotFoundf("key_id: no key %q (or it is revoked)", id)
	}
	k, ok := keys.Key(id)
	if !ok {
		return nil, errdefs.NotFoundf("key_id: no key %q (or it is revoked)", id)
	}
	u := &apitypes.KeyUsage{KeyID: k.ID, Name: k.Name, Tenant: k.Tenant, Quota: k.Quota}
	if g.opt.Fleet != nil {
		use, err := g.opt.Fleet.Usage(ctx, id)
		if err != nil {
			return nil, err
		}
		u.Use = use
	}
	return u, nil
}

// reply answers v with status, or err.
func reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, status, v)
}
