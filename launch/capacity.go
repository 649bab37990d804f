package launch

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// DefaultCapacityPoll is Config.CapacityPoll's default: how often the
// launcher reads Config.CapacityFile.
const DefaultCapacityPoll = 250 * time.Millisecond

// parseCapacity reads a capacity file's content: a whole number of
// workers, at least 1, with blanks around it.
func parseCapacity(b []byte) (int, error) {
	s := string(bytes.TrimSpace(b))
	if s == "" {
		return 0, fmt.Errorf("empty")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%.40q is not a whole number of workers >= 1", s)
	}
	return n, nil
}

// capacityWatcher reads the capacity file every poll interval and hands
// every change to the supervisor on changes. An unreadable or unparsable
// read is ignored (the last good value stays) and logged once per
// distinct problem; a file rewritten in place is read empty for an
// instant, which this absorbs. Its goroutine is owned by it and ends in
// close.
type capacityWatcher struct {
	path    string
	every   time.Duration
	log     *slog.Logger
	changes chan<- int
	quit    chan struct{}
	wg      sync.WaitGroup
	last    int    // the last good value (goroutine's)
	bad     string // the last problem logged (goroutine's)
}

// maxCapacityFile bounds what readCapacity reads of the file (bytes).
const maxCapacityFile = 4 << 10

// readCapacity reads the file once: its value, or an error naming the
// file. It never blocks and reads at most maxCapacityFile bytes: the file
// is opened without blocking and must be a regular file, so a FIFO, a
// device (a symlink to /dev/zero) or a huge file is an error, not a
// launcher that hangs at its end or reads without a bound.
func readCapacity(path string) (int, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, fmt.Errorf("launch: capacity file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("launch: capacity file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("launch: capacity file %s: not a regular file (%s)", path, fileKind(fi.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCapacityFile+1))
	if err != nil {
		return 0, fmt.Errorf("launch: capacity file: %w", err)
	}
	if len(b) > maxCapacityFile {
		return 0, fmt.Errorf("launch: capacity file %s: longer than %d bytes", path, maxCapacityFile)
	}
	n, err := parseCapacity(b)
	if err != nil {
		return 0, fmt.Errorf("launch: capacity file %s: %w", path, err)
	}
	return n, nil
}

func startCapacity(path string, every time.Duration, first int, changes chan<- int, log *slog.Logger) *capacityWatcher {
	w := &capacityWatcher{path: path, every: every, log: log, changes: changes, quit: make(chan struct{}), last: first}
	w.wg.Add(1)
	go w.run()
	return w
}

func (w *capacityWatcher) close() {
	close(w.quit)
	w.wg.Wait()
}

func (w *capacityWatcher) run() {
	defer w.wg.Done()
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-w.quit:
			return
		case <-t.C:
		}
		n, err := readCapacity(w.path)
		if err != nil {
			if msg := err.Error(); msg != w.bad {
				w.bad = msg
				w.log.Warn("capacity file read ignored; keeping the last capacity", "err", err, "capacity", w.last)
			}
			continue
		}
		w.bad = ""
		if n == w.last {
			continue
		}
		select {
		case w.changes <- n:
			w.last = n
		case <-w.quit:
			return
		}
	}
}

// fileKind names what a file that is not a regular one is, for an error.
func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeDir != 0:
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return "mode " + m.Type().String()
}
