package pipeline

import (
	"context"
)

// RunLabel marks the sandbox a run made for itself (an ephemeral run: no
// sandbox_id given) with the run's id; the run terminates it when it ends.
const RunLabel = "sandboxd.run"

// EndInterrupted terminates the ephemeral run sandboxes among ids, the
// sandboxes a restarted daemon adopted: a run lives in the daemon that
// started it, so one whose daemon died (kill -9, a crash) left its sandbox
// with nobody to end it, which would otherwise idle until its timeout. It
// returns the ids it terminated.
func (s *Service) EndInterrupted(ctx context.Context, ids []string) []string {
	var ended []string
	for _, id := range ids {
		info, err := s.sandboxes.Get(ctx, id)
		if err != nil || info.Labels[RunLabel] == "" {
			continue
		}
		if _, err := s.life.TerminateSandbox(ctx, id); err != nil {
			s.log.Warn("terminate the sandbox of an interrupted run", "sandbox", id, "run", info.Labels[RunLabel], "err", err)
			continue
		}
		s.log.Info("terminated the sandbox of an interrupted run", "sandbox", id, "run", info.Labels[RunLabel])
		ended = append(ended, id)
	}
	return ended
}
