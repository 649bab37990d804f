//go:build !race

package fixk

// raceBuild: see race_test.go.
const raceBuild = false
