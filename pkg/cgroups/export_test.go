package cgroups

// The tests are in package cgroups_test, because they use internal/testenv,
// which imports this package; these names let them reach the internals they
// check.
var (
	CheckPath     = checkPath
	HierarchyDirs = hierarchyDirs
)
