//go:build unix

package dataloader

import (
	"os"
	"syscall"
)

// mapFile maps the first size bytes of f read-only (OpenRecordsMapped).
func mapFile(f *os.File, size int) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
}

func unmapFile(mem []byte) { syscall.Munmap(mem) }
