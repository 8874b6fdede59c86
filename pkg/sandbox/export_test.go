package sandbox

// NewID is newID for the external tests (id_test.go), which import pkg/e2b.
var NewID = newID

// PoolRefillDelay is poolRefillDelay for the pool's tests.
const PoolRefillDelay = poolRefillDelay
