package pipeline

import (
	"context"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// An ephemeral run's sandbox is released after the run has answered, not
// before: nothing of the answer depends on it (the record is written
// first), and a terminate costs a container's teardown (6 ms quiet, more
// when the warm pool refills alongside) that the caller would otherwise
// wait for on every run_code. Only the terminated state is written before
// the answer (sandbox.OnTerminateRecorded), so that the sandbox is never
// listed live after it. Crash safety is unchanged: a daemon that dies
// before that write leaves a live sandbox carrying RunLabel, which its next
// start terminates (EndInterrupted); one that dies after it leaves a
// terminated record with ledger entries, which reconcile releases as for
// any terminate. The record's durationMs no longer includes the
// terminate. Until the
// terminate is done the sandbox still counts against max_sandboxes and
// its tenant's quota; a run refused for either waits for the releases in
// flight and tries once more (createEphemeral), so that a caller's
// sequential runs never trip over their own predecessors.

// releaseTimeout bounds one background terminate, as Finish bounds its own.
const releaseTimeout = time.Minute

// FinishAndRelease is Finish for a run whose caller is about to answer:
// the record is written now and an ephemeral sandbox is terminated in the
// background (WaitReleases waits for it).
func (r *CodeRun) FinishAndRelease(ctx context.Context, res *RunResult, runErr error) error {
	if !r.ephemeral || r.Sandbox == nil {
		return r.Finish(ctx, res, runErr)
	}
	sb := r.Sandbox
	r.ephemeral = false // Finish writes the record only
	err := r.Finish(ctx, res, runErr)
	r.ephemeral = true
	s := r.s
	s.startRelease()
	recorded, ended := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		defer s.endRelease()
		defer close(ended)
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		tctx = sandbox.OnTerminateRecorded(tctx, func() { once.Do(func() { close(recorded) }) })
		if _, err := s.life.TerminateSandbox(tctx, sb.ID); err != nil {
			s.log.Error("terminate ephemeral sandbox", "sandbox", sb.ID, "run", r.Record.ID, "err", err)
		}
	}()
	// The terminated state is written before the answer (one write to the
	// state database): a caller listing sandboxes after run_code answered
	// never sees its sandbox live. The release is what goes on after.
	select {
	case <-recorded:
	case <-ended:
	}
	return err
}

func (s *Service) startRelease() {
	s.releasesMu.Lock()
	defer s.releasesMu.Unlock()
	if s.releases == 0 {
		s.releasesIdle = make(chan struct{})
	}
	s.releases++
}

func (s *Service) endRelease() {
	s.releasesMu.Lock()
	defer s.releasesMu.Unlock()
	s.releases--
	s.released++
	if s.releases == 0 {
		close(s.releasesIdle)
	}
}

// WaitReleases waits until no ephemeral sandbox is being terminated in the
// background, or ctx ends. It reports whether there were any to wait for.
// The engine calls it on Close, so that no terminate is cut short.
func (s *Service) WaitReleases(ctx context.Context) bool {
	s.releasesMu.Lock()
	n, idle := s.releases, s.releasesIdle
	s.releasesMu.Unlock()
	if n == 0 {
		return false
	}
	select {
	case <-idle:
	case <-ctx.Done():
	}
	return true
}

// createEphemeral creates a run's sandbox; refused for max_sandboxes or a
// quota while earlier runs' sandboxes are still being released, it waits
// for them and tries once more.
func (s *Service) createEphemeral(ctx context.Context, create func() error) error {
	s.releasesMu.Lock()
	before := s.released
	s.releasesMu.Unlock()
	err := create()
	if errdefs.CodeOf(err) != errdefs.LimitExceeded {
		return err
	}
	waited := s.WaitReleases(ctx)
	s.releasesMu.Lock()
	// One that ended between the refusal and now counts too.
	ended := s.released != before
	s.releasesMu.Unlock()
	if waited || ended {
		err = create()
	}
	return err
}
