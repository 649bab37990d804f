package faultinject_test

import (
	"fmt"
	"io"
	"net"
	"time"

	"github.com/elastictrain/elastictrain/internal/faultinject"
)

// A schedule is a pure function of its seed: print it to replay a failure.
func ExampleNewSchedule() {
	s := faultinject.NewSchedule(42, faultinject.ScheduleConfig{
		Faults: 4,
		Kinds:  []faultinject.Kind{faultinject.Kill, faultinject.Join, faultinject.RedisRestart},
	})
	for _, f := range s {
		fmt.Println(f.Kind)
	}
	// Output:
	// join
	// kill
	// join
	// redis-restart
}

// A Proxy between a client and a server adds latency to every chunk.
func ExampleProxy() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c) // echo
		c.Close()
	}()
	p, _ := faultinject.NewProxy("127.0.0.1:0", ln.Addr().String())
	defer func() { p.Close(); ln.Close(); <-done }()
	p.SetLatency(20 * time.Millisecond)
	c, _ := net.Dial("tcp", p.Addr())
	defer c.Close()
	start := time.Now()
	c.Write([]byte("ping"))
	buf := make([]byte, 4)
	io.ReadFull(c, buf)
	fmt.Println(string(buf), time.Since(start) >= 40*time.Millisecond)
	// Output: ping true
}
