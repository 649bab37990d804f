//go:build linux && (amd64 || arm64)

package sync

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

const (
	fAddSeals    = 1033 // F_ADD_SEALS
	fGetSeals    = 1034 // F_GET_SEALS
	fSealSeal    = 0x1
	fSealShrink  = 0x2
	mfdCloexec   = 0x1
	mfdAllowSeal = 0x2
)

func sysMemfdCreate() uintptr {
	if runtime.GOARCH == "arm64" {
		return 279
	}
	return 319
}

// shmSupported reports whether this build can share lane buffers.
const shmSupported = true

// shmCreate makes an anonymous shared-memory file of size bytes that cannot
// shrink (so the peer can never make our mapping fault), maps it and
// returns its descriptor (to pass to the peer, then close) and the mapping.
func shmCreate(size int) (int, []byte, error) {
	name := []byte("elastictrain-sync\x00")
	fd, _, errno := syscall.Syscall(sysMemfdCreate(), uintptr(unsafe.Pointer(&name[0])), mfdCloexec|mfdAllowSeal, 0)
	if errno != 0 {
		return -1, nil, fmt.Errorf("memfd_create: %w", errno)
	}
	if err := syscall.Ftruncate(int(fd), int64(size)); err != nil {
		syscall.Close(int(fd))
		return -1, nil, fmt.Errorf("ftruncate: %w", err)
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, fAddSeals, fSealShrink|fSealSeal); errno != 0 {
		syscall.Close(int(fd))
		return -1, nil, fmt.Errorf("sealing: %w", errno)
	}
	mem, err := syscall.Mmap(int(fd), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		syscall.Close(int(fd))
		return -1, nil, fmt.Errorf("mmap: %w", err)
	}
	return int(fd), mem, nil
}

// shmMap maps a descriptor received from a peer after checking that it is
// sealed against shrinking and at least size bytes long.
func shmMap(fd, size int) ([]byte, error) {
	seals, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), fGetSeals, 0)
	if errno != 0 || seals&fSealShrink == 0 {
		return nil, fmt.Errorf("shared memory from peer is not sealed against shrinking")
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Size < int64(size) {
		return nil, fmt.Errorf("shared memory of %d bytes, want %d", st.Size, size)
	}
	return syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

func shmUnmap(b []byte) {
	if b != nil {
		syscall.Munmap(b)
	}
}

func closeFD(fd int) { syscall.Close(fd) }
