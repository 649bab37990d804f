package standalone_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic/standalone"
)

// Example starts an embedded server on a free loopback port and talks to it
// with an ordinary go-redis client.
func Example() {
	ctx := context.Background()
	srv, err := standalone.Start(ctx, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	fmt.Println(c.Ping(ctx).Val())
	// Output: PONG
}
