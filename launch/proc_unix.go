//go:build unix

package launch

import "syscall"

// signalGroup sends sig to the process group led by pid (every worker
// leads one, see sysProcAttr).
func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
