//go:build !race

package sumk

// raceBuild: see race_test.go.
const raceBuild = false
