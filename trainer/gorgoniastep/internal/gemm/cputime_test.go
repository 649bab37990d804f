//go:build unix

package gemm

import "syscall"

// cpuNanos is the CPU time (user and system) this process has used: the
// benchmarks report GFLOP/s of CPU time too, which the other jobs on a
// shared machine disturb much less than wall time.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
