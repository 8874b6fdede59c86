package sandbox

import "testing"

func TestTransitions(t *testing.T) {
	all := []State{StateCreating, StateReady, StateRunning, StateTerminated, StateFailed}
	legal := map[[2]State]bool{
		{StateCreating, StateReady}: true, {StateCreating, StateFailed}: true, {StateCreating, StateTerminated}: true,
		{StateReady, StateRunning}: true, {StateReady, StateTerminated}: true,
		{StateRunning, StateReady}: true, {StateRunning, StateTerminated}: true,
		{StateFailed, StateTerminated}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got, want := CanTransition(from, to), legal[[2]State{from, to}]; got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
	if StateTerminated.Live() || StateFailed.Live() || !StateRunning.Live() {
		t.Error("Live() is wrong")
	}
	if State("paused").Valid() {
		t.Error(`State("paused").Valid() = true`)
	}
}
