//go:build !unix

package gemm

func cpuNanos() int64 { return 0 }
