package sandbox

import (
	"fmt"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// State is a sandbox's lifecycle state (docs/SPEC.md "Sandbox states").
type State = apitypes.State

// The states. running means at least one command is executing.
const (
	StateCreating   = apitypes.StateCreating
	StateReady      = apitypes.StateReady
	StateRunning    = apitypes.StateRunning
	StatePaused     = apitypes.StatePaused
	StateTerminated = apitypes.StateTerminated
	StateFailed     = apitypes.StateFailed
)

// transitions is the state machine of docs/ARCHITECTURE.md:
//
//	creating --> ready <--> running
//	   |           |  ^        |  ^
//	   |           v  |        v  |
//	   |          paused <-----+--+   (resume goes back to running when
//	   |           |                   commands are still in flight)
//	   +--> failed +-- ... ---------> terminated (from any live state)
//
// failed may still go to terminated so that terminating a failed sandbox is
// idempotent cleanup rather than an error.
var transitions = map[State][]State{
	StateCreating: {StateReady, StateFailed, StateTerminated},
	StateReady:    {StateRunning, StatePaused, StateTerminated},
	StateRunning:  {StateReady, StatePaused, StateTerminated},
	StatePaused:   {StateReady, StateRunning, StateTerminated},
	StateFailed:   {StateTerminated},
}

// CanTransition reports whether from → to is a legal transition.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ErrIllegalTransition is wrapped by errors for refused transitions; it means a
// bug in the caller, never bad user input.
type ErrIllegalTransition struct{ From, To State }

func (e *ErrIllegalTransition) Error() string {
	return fmt.Sprintf("illegal sandbox state transition %s -> %s", e.From, e.To)
}
