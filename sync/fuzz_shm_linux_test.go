//go:build linux && (amd64 || arm64)

package sync

import (
	"net"
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// FuzzReadOffer: a same-host peer's shared-memory offer (12 bytes, and a
// descriptor that may be missing, unsealed or too small) is mapped only when
// it is sealed, large enough and of the expected layout; otherwise it is
// declined or refused. Never a panic, never a mapping of the wrong size.
func FuzzReadOffer(f *testing.F) {
	const size = shmHeader + shmSlots*256
	ok := append(append([]byte{}, shmMagic[:]...), 4, 0, 0, 0, 0, 1, 0, 0)
	f.Add(ok, uint8(1), uint32(size))
	f.Add(ok, uint8(2), uint32(size))
	f.Add(ok, uint8(1), uint32(size-1))
	f.Add(ok[:7], uint8(0), uint32(0))
	f.Add([]byte("XXXX\xff\xff\xff\xff\xff\xff\xff\xff"), uint8(1), uint32(size))
	f.Fuzz(func(t *testing.T, msg []byte, fdMode uint8, fileSize uint32) {
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		a, b := unixConn(t, fds[0]), unixConn(t, fds[1])
		defer a.Close()
		defer b.Close()
		var oob []byte
		if fdMode%3 != 0 {
			fd := memfd(t, int64(fileSize%(1<<20)), fdMode%3 == 1)
			defer syscall.Close(fd)
			oob = syscall.UnixRights(fd)
		}
		if len(msg) > 64 {
			msg = msg[:64]
		}
		if _, _, err := a.WriteMsgUnix(msg, oob, nil); err != nil && len(msg) > 0 {
			t.Fatal(err)
		}
		a.CloseWrite()
		mem, err := readOffer(b, size, true)
		if mem != nil {
			if err != nil || len(mem) != size {
				t.Fatalf("mapped %d bytes with error %v", len(mem), err)
			}
			shmUnmap(mem)
		}
	})
}

func unixConn(t *testing.T, fd int) *net.UnixConn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}

// memfd returns an anonymous file of size bytes, sealed against shrinking
// when sealed.
func memfd(t *testing.T, size int64, sealed bool) int {
	t.Helper()
	name := []byte("fuzz-offer\x00")
	fd, _, errno := syscall.Syscall(sysMemfdCreate(), uintptr(unsafe.Pointer(&name[0])), mfdCloexec|mfdAllowSeal, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	if err := syscall.Ftruncate(int(fd), size); err != nil {
		t.Fatal(err)
	}
	if sealed {
		if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, fAddSeals, fSealShrink|fSealSeal); errno != 0 {
			t.Fatal(errno)
		}
	}
	return int(fd)
}
