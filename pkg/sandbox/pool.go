package sandbox

import (
	"context"
	"encoding/json"
	"maps"
	"reflect"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// The warm pool keeps sandbox.pool[image] ready sandboxes per image, started
// from the spec a default request gets. A create request that a warm sandbox
// satisfies (same image, limits, network and user) takes one instead of
// starting a container, and the pool refills in the background. Warm
// sandboxes count towards max_sandboxes, are never reaped for idleness, and
// carry the label PoolLabel until they are claimed.

// PoolLabel marks a warm sandbox that no request has claimed yet.
const PoolLabel = "sandboxd.pool"

// poolRetry is how long the pool waits after failing to start a sandbox
// (an image not built yet, say) before it tries that image again.
const poolRetry = 30 * time.Second

// poolRefillDelay is how long after a claim the pool starts its refill at
// the latest: long enough for a short request on the claimed sandbox to
// answer first, short enough that a burst of claims finds the pool full
// again soon after.
const poolRefillDelay = 250 * time.Millisecond

// TemplatePoolKey is the warm pool key of template name's sandboxes.
func TemplatePoolKey(name string) string { return "template:" + name }

// poolKey is the warm pool a spec's sandbox comes from: its template's, or
// its image's.
func poolKey(spec Spec) string {
	if spec.Template != "" {
		return TemplatePoolKey(spec.Template)
	}
	return spec.Image
}

// SetPool sets the warm pool size of key at run time (a template's pool);
// 0 removes it. Warm sandboxes beyond the size stay until claimed or
// terminated.
func (m *Manager) SetPool(key string, n int) {
	m.mu.Lock()
	if m.poolSizes == nil {
		m.poolSizes = map[string]int{}
	}
	if n > 0 {
		m.poolSizes[key] = n
	} else {
		delete(m.poolSizes, key)
	}
	m.mu.Unlock()
	m.pokePool()
}

// poolSize is the warm pool size of key.
func (m *Manager) poolSize(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.poolSizes[key]; ok {
		return n
	}
	return m.opt.Pool[key]
}

// WarmPool is one warm pool as metrics show it.
type WarmPool struct {
	// Size is how many warm sandboxes the pool keeps.
	Size int
	// Warm is how many are ready and unclaimed now.
	Warm int
}

// WarmPools reports every pool with a size, by key (an image, or
// TemplatePoolKey of a template).
func (m *Manager) WarmPools() map[string]WarmPool {
	out := map[string]WarmPool{}
	for key, size := range m.poolKeys() {
		out[key] = WarmPool{Size: size, Warm: m.warm(key)}
	}
	return out
}

// poolKeys lists every pool with a size.
func (m *Manager) poolKeys() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := maps.Clone(m.opt.Pool)
	if out == nil {
		out = map[string]int{}
	}
	maps.Copy(out, m.poolSizes)
	return out
}

// WarmIDs lists the unclaimed warm sandboxes of pool key.
func (m *Manager) WarmIDs(key string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for id, sb := range m.sandboxes {
		sb.mu.Lock()
		if sb.pooled && poolKey(sb.spec) == key && !sb.terminating {
			out = append(out, id)
		}
		sb.mu.Unlock()
	}
	return out
}

// poolable reports whether a warm sandbox of spec's pool can serve spec.
func (m *Manager) poolable(spec Spec) (Spec, bool) {
	// A fork carries its snapshot's files: a warm sandbox has none.
	// Nor does it mount volumes (mounts are made at start).
	// A pinned image digest may be an older build than the warm ones run.
	if m.poolSize(poolKey(spec)) <= 0 || m.opt.PoolSpec == nil || spec.Seed != "" || len(spec.Volumes) > 0 || spec.ImageDigest != "" {
		return Spec{}, false
	}
	tmpl, err := m.opt.PoolSpec(poolKey(spec))
	if err != nil {
		return Spec{}, false
	}
	return tmpl, spec.Limits == tmpl.Limits && spec.DiskBacking == tmpl.DiskBacking && spec.Network == tmpl.Network && len(spec.Allow) == 0 && len(tmpl.Allow) == 0 &&
		// A warm sandbox has no credential grants (they are made at attach).
		len(spec.Credentials) == 0 && len(tmpl.Credentials) == 0 && spec.UID == tmpl.UID && spec.Root == tmpl.Root && spec.Backend == tmpl.Backend && spec.SeccompProfile == tmpl.SeccompProfile
}

// claim hands a warm sandbox to a request, giving it the request's identity
// (language, environment, labels, lifetime from now). It returns nil when
// none is free.
func (m *Manager) claim(ctx context.Context, spec Spec) (*Info, error) {
	if _, ok := m.poolable(spec); !ok {
		return nil, nil
	}
	var sb *Sandbox
	m.mu.Lock()
	for _, c := range m.sandboxes {
		c.mu.Lock()
		// A template's warm sandbox runs its start command: running.
		usable := c.state == StateReady || (c.state == StateRunning && c.spec.Template != "")
		free := c.pooled && !c.terminating && usable && poolKey(c.spec) == poolKey(spec)
		if free {
			c.pooled = false
		}
		c.mu.Unlock()
		if free {
			sb = c
			break
		}
	}
	m.mu.Unlock()
	if sb == nil {
		return nil, nil
	}
	// The refill is a whole create (tens of ms of CPU on a 2-core host):
	// started now, it would compete with the very request that claimed
	// the sandbox — run_code's exec, measured in BenchmarkRunCodePythonWarmPool.
	// It starts when the claimed sandbox ends (forget: run_code's
	// ephemeral sandbox, terminated after the run answered) or after
	// poolRefillDelay, whichever comes first; until then fillPool's ticks
	// pass this pool by (held).
	sb.fromPool.Store(true)
	m.mu.Lock()
	if m.refillHold == nil {
		m.refillHold = map[string]time.Time{}
	}
	m.refillHold[poolKey(spec)] = time.Now().Add(poolRefillDelay)
	m.mu.Unlock()
	time.AfterFunc(poolRefillDelay, m.pokePool)

	now := m.opt.Now().UTC()
	sb.mu.Lock()
	imageEnv := sb.spec.ImageEnv
	sb.spec = spec
	sb.spec.ImageEnv = imageEnv
	sb.setTenant(spec.Tenant)
	sb.createdAt, sb.lastActive = now, now
	specJSON, err := json.Marshal(sb.spec)
	sb.mu.Unlock()
	if err != nil {
		return nil, err
	}
	err = m.opt.Store.UpdateSandbox(ctx, sb.ID, func(r *store.SandboxRecord) {
		r.Spec, r.Language, r.CreatedAt, r.LastActiveAt = specJSON, spec.Language, now, now
	})
	if err != nil {
		return nil, err
	}
	m.log.Debug("claimed a warm sandbox", "sandbox", sb.ID, "image", spec.Image)
	// The warm sandbox announced nothing while it was nobody's: for its
	// caller it is created, and ready, now.
	sb.mu.Lock()
	m.announceSandbox(sb, apitypes.EventSandboxCreated, "")
	m.announceSandbox(sb, apitypes.EventSandboxReady, "")
	sb.mu.Unlock()
	return m.Get(ctx, sb.ID)
}

// pokePool asks the pool to refill now rather than at its next tick.
func (m *Manager) pokePool() {
	select {
	case m.poolPoke <- struct{}{}:
	default:
	}
}

// fillPool keeps the pool at its configured size until ctx ends.
func (m *Manager) fillPool(ctx context.Context) {
	defer close(m.poolDone)
	failedAt := map[string]time.Time{}
	t := time.NewTicker(m.opt.ReapInterval)
	defer t.Stop()
	for {
		for img, want := range m.poolKeys() {
			if ctx.Err() != nil {
				return
			}
			if time.Since(failedAt[img]) < poolRetry || m.held(img) || m.warm(img) >= want {
				continue
			}
			if err := m.startWarm(ctx, img); err != nil {
				if ctx.Err() == nil {
					m.log.Warn("warm pool: cannot start a sandbox", "image", img, "err", err, "retry_in", poolRetry)
				}
				failedAt[img] = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.poolPoke:
		}
	}
}

// held reports whether key's refill waits for a claimer (see claim).
func (m *Manager) held(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Now().Before(m.refillHold[key])
}

// warm counts the unclaimed warm sandboxes of img.
func (m *Manager) warm(img string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, sb := range m.sandboxes {
		sb.mu.Lock()
		if sb.pooled && poolKey(sb.spec) == img && !sb.terminating {
			n++
		}
		sb.mu.Unlock()
	}
	return n
}

// startWarm starts one warm sandbox of img.
func (m *Manager) startWarm(ctx context.Context, img string) error {
	spec, err := m.opt.PoolSpec(img)
	if err != nil {
		return err
	}
	spec.Labels = map[string]string{PoolLabel: "warm"}
	info, err := m.create(ctx, spec)
	if err != nil {
		return err
	}
	if m.opt.PoolReady != nil {
		if err := m.opt.PoolReady(ctx, info.ID, img); err != nil {
			if _, terr := m.Terminate(context.WithoutCancel(ctx), info.ID, "warm pool: not ready: "+err.Error()); terr != nil {
				m.log.Error("warm pool: terminate a sandbox that did not get ready", "sandbox", info.ID, "err", terr)
			}
			return err
		}
	}
	m.mu.Lock()
	sb := m.sandboxes[info.ID]
	m.mu.Unlock()
	if sb != nil {
		sb.mu.Lock()
		sb.pooled = true
		sb.mu.Unlock()
	}
	return nil
}

// isWarm reports whether a recorded spec is that of an unclaimed warm sandbox.
func isWarm(spec Spec) bool {
	return reflect.DeepEqual(spec.Labels, map[string]string{PoolLabel: "warm"})
}
