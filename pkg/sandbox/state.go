package sandbox

import "fmt"

// State is a sandbox's lifecycle state (SPEC.md "Sandbox states").
type State string

// The states. running means at least one command is executing.
const (
	StateCreating   State = "creating"
	StateReady      State = "ready"
	StateRunning    State = "running"
	StateTerminated State = "terminated"
	StateFailed     State = "failed"
)

// transitions is the state machine of ARCHITECTURE.md:
//
//	creating --> ready <--> running
//	   |           |           |
//	   +--> failed +-----------+--> terminated
//
// failed may still go to terminated so that terminating a failed sandbox is
// idempotent cleanup rather than an error.
var transitions = map[State][]State{
	StateCreating: {StateReady, StateFailed, StateTerminated},
	StateReady:    {StateRunning, StateTerminated},
	StateRunning:  {StateReady, StateTerminated},
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

// Live reports whether s is a state in which the sandbox holds resources.
func (s State) Live() bool { return s == StateCreating || s == StateReady || s == StateRunning }

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool {
	switch s {
	case StateCreating, StateReady, StateRunning, StateTerminated, StateFailed:
		return true
	}
	return false
}

// ErrIllegalTransition is wrapped by errors for refused transitions; it means a
// bug in the caller, never bad user input.
type ErrIllegalTransition struct{ From, To State }

func (e *ErrIllegalTransition) Error() string {
	return fmt.Sprintf("illegal sandbox state transition %s -> %s", e.From, e.To)
}
