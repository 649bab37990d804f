//go:build unix && !linux

package launch

import "syscall"

// sysProcAttr puts a worker in a process group of its own. There is no
// parent-death signal outside Linux: a launcher killed with SIGKILL leaves
// its workers running (they lose their store, when it was the embedded
// one, and fail).
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// waitExited cannot wait without reaping here (waitid also returns for a
// stopped process on some of these systems, golang/go#19314): it reports
// false, and the launcher signals nothing after the worker exited.
func waitExited(int) bool { return false }
