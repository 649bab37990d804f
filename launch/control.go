package launch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/elastictrain/elastictrain/worker"
)

// The control channel: a Unix socket in a directory of the launcher's own
// (mode 0700, so only the launcher's user reaches it), named to the
// workers in EnvControl. Unix sockets are found by path, so the workers
// reach it from network namespaces of their own too (Spec.Wrap).
//
// One request per connection: the client writes one JSON object and a
// newline, the launcher answers with one JSON object and a newline and
// closes the connection. A request the launcher cannot read (not JSON,
// longer than maxControlLine, an unknown op, a bad argument) is answered
// with an error and the connection closed; nothing a client sends stops
// the launcher.

// maxControlLine bounds a request (bytes, with its newline).
const maxControlLine = 4 << 10

// controlTimeout bounds how long the launcher waits for a request's line
// and for the supervisor's answer.
const controlTimeout = 5 * time.Second

// ErrControl is wrapped by the errors of a worker's Platform (see
// Worker.Platform) when the launcher refused a request or could not be
// reached.
var ErrControl = errors.New("launch: control")

// controlRequest is one request on the control socket.
type controlRequest struct {
	// Op is "capacity", "resize" or "release".
	Op string `json:"op"`
	// Target is Resize's target world size.
	Target int `json:"target,omitempty"`
	// Worker and Restart name the calling worker process (Release).
	Worker  int `json:"worker"`
	Restart int `json:"restart"`
}

// controlReply is the launcher's answer.
type controlReply struct {
	Error string `json:"error,omitempty"`
	// Capacity is the workers the launcher allows now (capacity).
	Capacity int `json:"capacity,omitempty"`
	// Bounded is false when the launcher states no bound (capacity).
	Bounded bool `json:"bounded,omitempty"`
	// Workers is the worker count the launcher aims for after a resize.
	Workers int `json:"workers,omitempty"`
}

// ctlCall is a request handed to the supervisor, which answers on reply
// (buffered: it never blocks).
type ctlCall struct {
	req   controlRequest
	reply chan controlReply
}

// controlServer serves the control socket. Its goroutines (the accept
// loop and one per connection) are owned by it and end in close.
type controlServer struct {
	dir, path string
	ln        *net.UnixListener
	calls     chan<- ctlCall
	log       *slog.Logger
	quit      chan struct{}
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     map[net.Conn]bool
}

// startControl listens on a fresh socket and serves it; requests go to
// calls (the supervisor).
func startControl(calls chan<- ctlCall, log *slog.Logger) (*controlServer, error) {
	dir, err := os.MkdirTemp("", "elastictrain-launch-")
	if err != nil {
		return nil, fmt.Errorf("launch: control socket: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("launch: control socket: %w", err)
	}
	path := filepath.Join(dir, "control.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("launch: control socket (set TMPDIR to a short path if this one is too long): %w", err)
	}
	s := &controlServer{dir: dir, path: path, ln: ln, calls: calls, log: log, quit: make(chan struct{}),
		conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// close stops the accept loop, closes every open connection, waits for
// the goroutines and removes the socket's directory.
func (s *controlServer) close() {
	close(s.quit)
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	os.RemoveAll(s.dir)
}

// acceptBackoff bounds the wait between two failed accepts (a launcher
// out of file descriptors, say): it starts at 5 ms and doubles.
const acceptBackoff = time.Second

func (s *controlServer) accept() {
	defer s.wg.Done()
	var wait time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.quit:
				return
			default:
			}
			// A failed accept (EMFILE under a flood of connections, say)
			// passes: retry with a backoff rather than close the socket
			// for the rest of the job, logging once per streak.
			if wait == 0 {
				s.log.Warn("control socket: accept failed; retrying", "err", err)
				wait = 5 * time.Millisecond
			} else {
				wait = min(2*wait, acceptBackoff)
			}
			t := time.NewTimer(wait)
			select {
			case <-s.quit:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		if wait != 0 {
			s.log.Info("control socket: accepting again")
			wait = 0
		}
		s.mu.Lock()
		select {
		case <-s.quit:
			s.mu.Unlock()
			c.Close()
			return
		default:
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve answers the one request of connection c.
func (s *controlServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(controlTimeout))
	rep := s.handle(c)
	b, _ := json.Marshal(rep)
	c.Write(append(b, '\n'))
	// Half-close and read what the client still sends until it closes
	// (within the deadline, at most 64 KiB): closing with unread input
	// would reset the connection and lose the answer (an oversized
	// request's, say).
	if uc, ok := c.(*net.UnixConn); ok {
		uc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

func (s *controlServer) handle(c net.Conn) controlReply {
	refuse := func(format string, a ...any) controlReply {
		msg := "launch: control: " + fmt.Sprintf(format, a...)
		s.log.Warn("control socket: request refused", "why", msg)
		return controlReply{Error: msg}
	}
	line, err := bufio.NewReaderSize(c, maxControlLine).ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return refuse("request longer than %d bytes", maxControlLine)
		}
		return refuse("reading the request (one JSON object and a newline): %v", err)
	}
	var req controlRequest
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	err = dec.Decode(&req)
	if err == nil {
		if _, tok := dec.Token(); tok != io.EOF {
			err = errors.New("more than one JSON value on the line")
		}
	}
	if err != nil {
		return refuse("request is not a JSON object of op, target, worker and restart: %v", err)
	}
	switch req.Op {
	case "capacity":
	case "resize":
		if req.Target < 1 {
			return refuse("resize to %d: want a target of at least 1", req.Target)
		}
	case "release":
		if req.Worker < 0 || req.Restart < 0 {
			return refuse("release of worker %d restart %d: want an index and restart >= 0", req.Worker, req.Restart)
		}
	default:
		return refuse("unknown op %q: want capacity, resize or release", req.Op)
	}
	call := ctlCall{req: req, reply: make(chan controlReply, 1)}
	t := time.NewTimer(controlTimeout)
	defer t.Stop()
	select {
	case s.calls <- call:
	case <-s.quit:
		return controlReply{Error: "launch: control: the job is over"}
	case <-t.C:
		return refuse("the launcher did not take the request within %v", controlTimeout)
	}
	select {
	case rep := <-call.reply:
		return rep
	case <-s.quit:
		return controlReply{Error: "launch: control: the job is over"}
	}
}

// platform is a worker's client of the launcher's control socket: the
// worker.Platform of a worker that a launcher started (Worker.Platform).
// Each call dials the socket, sends one request and reads one answer,
// within its context. Safe for concurrent use.
type platform struct {
	path    string
	worker  int
	restart int
}

var _ worker.Platform = (*platform)(nil)

// Platform returns the worker's worker.Platform: a client of the
// launcher's control socket (EnvControl). Capacity says how many workers
// the launcher allows (its capacity file, at most Config.MaxWorkers);
// Resize asks it to run a number of workers (it starts the missing ones,
// within the capacity and Config.MaxWorkers); Release tells it that this
// worker leaves by decision (it is not restarted). Errors wrap ErrControl.
// Platform returns nil when the launcher opened no control socket (neither
// Config.Autoscale nor Config.CapacityFile was set): the trainer then
// scales nothing.
func (w Worker) Platform() worker.Platform {
	if w.Control == "" {
		return nil
	}
	return &platform{path: w.Control, worker: w.Index, restart: w.Restart}
}

func (p *platform) Capacity(ctx context.Context) (int, bool, error) {
	rep, err := p.call(ctx, controlRequest{Op: "capacity"})
	if err != nil {
		return 0, false, err
	}
	return rep.Capacity, rep.Bounded, nil
}

func (p *platform) Resize(ctx context.Context, target int) error {
	if target < 1 {
		return fmt.Errorf("%w: resize to %d: want a target of at least 1", ErrControl, target)
	}
	_, err := p.call(ctx, controlRequest{Op: "resize", Target: target})
	return err
}

func (p *platform) Release(ctx context.Context) error {
	_, err := p.call(ctx, controlRequest{Op: "release", Worker: p.worker, Restart: p.restart})
	return err
}

func (p *platform) call(ctx context.Context, req controlRequest) (controlReply, error) {
	if p == nil {
		return controlReply{}, fmt.Errorf("%w: no control socket (the launcher sets %s)", ErrControl, EnvControl)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p.path)
	if err != nil {
		return controlReply{}, fmt.Errorf("%w: %s: %w", ErrControl, req.Op, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return controlReply{}, fmt.Errorf("%w: %s: %w", ErrControl, req.Op, ctxErr(ctx, err))
	}
	line, err := bufio.NewReaderSize(c, maxControlLine).ReadSlice('\n')
	if err != nil {
		return controlReply{}, fmt.Errorf("%w: %s: reading the answer: %w", ErrControl, req.Op, ctxErr(ctx, err))
	}
	var rep controlReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return controlReply{}, fmt.Errorf("%w: %s: unreadable answer: %w", ErrControl, req.Op, err)
	}
	if rep.Error != "" {
		return rep, fmt.Errorf("%w: %s refused: %s", ErrControl, req.Op, rep.Error)
	}
	return rep, nil
}

// ctxErr is ctx's error when ctx is done (the deadline it set cut the
// call), else err.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
