//go:build race

package fixk

// raceBuild: under the race detector the gc compiler may order the
// operands of the Go code's additions differently (they commute), so where
// both are NaN the Go code keeps the other NaN than in a normal build, and
// the assembly (which matches the normal build) is compared up to that.
const raceBuild = true
