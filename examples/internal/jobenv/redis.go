package jobenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvRedisPassword names the environment variable that holds the Redis
// password (of the ACL user -redis-user, or of the default user), so the
// password never goes on a command line; on Kubernetes it comes from a
// Secret.
const EnvRedisPassword = "ELASTICTRAIN_REDIS_PASSWORD"

// Redis says how a worker reaches its Redis: the -redis address (or, with
// Master, the Sentinels' addresses), and the -redis-master, -redis-user,
// -redis-tls and -redis-ca flags; the password comes from
// EnvRedisPassword. The zero value with Addr set is a plain TCP client
// without authentication.
type Redis struct {
	// Addr is host:port of the server; with Master, a comma-separated
	// list of Redis Sentinel addresses (host:port,host:port,...).
	Addr string
	// Master, when set, is the name of the master the Sentinels monitor:
	// the client is go-redis' failover client, which asks the Sentinels
	// for the current master and follows a failover.
	Master string
	// User is the Redis ACL user name ("" = the default user).
	User string
	// TLS makes the client talk TLS to Redis (and to the Sentinels),
	// verifying the server's certificate against the system roots or
	// CAFile.
	TLS bool
	// CAFile, when set, holds the PEM certificates the client trusts
	// instead of the system roots; it implies TLS.
	CAFile string
}

// RegisterFlags registers -redis-master, -redis-user, -redis-tls and
// -redis-ca on fs (each program registers -redis itself, with its own
// default's wording).
func (r *Redis) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&r.Master, "redis-master", "", "name of the master Redis Sentinels monitor; -redis then lists the Sentinels (host:port,host:port,...) and workers follow a failover")
	fs.StringVar(&r.User, "redis-user", "", "Redis ACL user name (its password comes from $"+EnvRedisPassword+")")
	fs.BoolVar(&r.TLS, "redis-tls", false, "talk TLS to Redis, verifying its certificate against the system roots (or -redis-ca)")
	fs.StringVar(&r.CAFile, "redis-ca", "", "PEM file of the certificate authorities to trust for Redis TLS (implies -redis-tls)")
}

// Args returns the command-line flags that pass r on to a worker
// (without -redis, which the programs pass themselves).
func (r Redis) Args() []string {
	var a []string
	if r.Master != "" {
		a = append(a, "-redis-master", r.Master)
	}
	if r.User != "" {
		a = append(a, "-redis-user", r.User)
	}
	if r.TLS {
		a = append(a, "-redis-tls")
	}
	if r.CAFile != "" {
		a = append(a, "-redis-ca", r.CAFile)
	}
	return a
}

// addrs splits Addr into its addresses.
func (r Redis) addrs() []string {
	var out []string
	for _, a := range strings.Split(r.Addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Validate checks the flags without dialing: every address is host:port,
// several addresses only with -redis-master, a readable -redis-ca.
func (r Redis) Validate() error {
	addrs := r.addrs()
	if len(addrs) == 0 {
		return errors.New("-redis: want host:port")
	}
	if len(addrs) > 1 && r.Master == "" {
		return fmt.Errorf("-redis %q: several addresses are Redis Sentinels, and need -redis-master", r.Addr)
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("-redis %q: want host:port: %w", a, err)
		}
	}
	if r.CAFile != "" {
		if _, err := r.tlsConfig(); err != nil {
			return err
		}
	}
	return nil
}

func (r Redis) tlsConfig() (*tls.Config, error) {
	if !r.TLS && r.CAFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.CAFile != "" {
		pem, err := os.ReadFile(r.CAFile)
		if err != nil {
			return nil, fmt.Errorf("-redis-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-redis-ca: no PEM certificate in %s", r.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// Client returns a go-redis client for r: a failover client (through the
// Sentinels) with Master, else a plain client; dial, read and write
// timeouts of 2 s. The caller closes it.
func (r Redis) Client() (redis.UniversalClient, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	tc, err := r.tlsConfig()
	if err != nil {
		return nil, err
	}
	password := os.Getenv(EnvRedisPassword)
	const timeout = 2 * time.Second
	if r.Master != "" {
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: r.Master, SentinelAddrs: r.addrs(),
			Username: r.User, Password: password, TLSConfig: tc,
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
		}), nil
	}
	if tc != nil {
		host, _, _ := net.SplitHostPort(r.Addr)
		tc.ServerName = host
	}
	return redis.NewClient(&redis.Options{
		Addr: r.Addr, Username: r.User, Password: password, TLSConfig: tc,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
	}), nil
}

// Ping checks, within 3 s, that the Redis r names answers a PING (through
// the Sentinels' current master with -redis-master), so a wrong flag is one
// clear error rather than N failing workers.
func (r Redis) Ping(ctx context.Context) error {
	// go-redis logs failed dials itself; the error below says it once.
	redis.SetLogger(quietRedis{})
	c, err := r.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("-redis %s does not answer: %w", r.Addr, err)
	}
	return nil
}

// OpenRedis is OpenStore for a store named by all of r's flags: with
// r.Addr set it pings r (Redis.Ping); with r.Addr empty it starts an
// embedded server.
func OpenRedis(ctx context.Context, r Redis) (*Store, error) {
	if r.Addr == "" {
		return OpenStore(ctx, "")
	}
	if err := r.Ping(ctx); err != nil {
		return nil, err
	}
	return &Store{Addr: r.Addr, Desc: r.Addr}, nil
}

// redisLogger writes go-redis' own log lines to a *slog.Logger.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// LogRedisTo routes go-redis' own log lines (failed dials, pool events),
// which it otherwise prints as plain text on standard error, to l at level
// Warn with component=go-redis, so a JSON log stream stays JSON. It sets
// go-redis' process-wide logger.
func LogRedisTo(l *slog.Logger) { redis.SetLogger(redisLogger{l}) }
