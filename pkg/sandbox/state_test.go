package sandbox

import "testing"

func TestTransitions(t *testing.T) {
	all := []State{StateCreating, StateReady, StateRunning, StatePaused, StateTerminated, StateFailed}
	legal := map[[2]State]bool{
		{StateCreating, StateReady}: true, {StateCreating, StateFailed}: true, {StateCreating, StateTerminated}: true,
		{StateReady, StateRunning}: true, {StateReady, StateTerminated}: true, {StateReady, StatePaused}: true,
		{StateRunning, StateReady}: true, {StateRunning, StateTerminated}: true, {StateRunning, StatePaused}: true,
		{StatePaused, StateReady}: true, {StatePaused, StateRunning}: true, {StatePaused, StateTerminated}: true,
		{StateFailed, StateTerminated}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got, want := CanTransition(from, to), legal[[2]State{from, to}]; got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
	if StateTerminated.Live() || StateFailed.Live() || !StateRunning.Live() || !StatePaused.Live() {
		t.Error("Live() is wrong")
	}
	if !StatePaused.Valid() || State("frozen").Valid() {
		t.Error("Valid() is wrong")
	}
}
