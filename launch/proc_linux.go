//go:build linux

package launch

import (
	"syscall"
	"unsafe"
)

// sysProcAttr puts a worker in a process group of its own (so a signal
// reaches whatever it started, and a terminal's Ctrl-C reaches only the
// launcher, which forwards it) and has the kernel SIGKILL it when the
// launcher dies, even of a SIGKILL. Pdeathsig fires when the thread that
// started the worker exits; the Go runtime ends a thread only when a
// goroutine locked to it returns, and the launcher's goroutines never lock
// one.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitExited blocks until process pid has exited, without reaping it
// (waitid with WNOWAIT, as package os does before its own wait): while it
// is a zombie its pid, and so its process group's ID, cannot be reused, so
// the launcher may still signal the group safely. It returns false when
// it cannot tell (waitid is missing or fails); the caller then reaps at
// once and signals nothing more.
func waitExited(pid int) bool {
	const pPID = 1     // P_PID
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])),
			syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return true
		case syscall.EINTR:
			continue
		}
		return false
	}
}
