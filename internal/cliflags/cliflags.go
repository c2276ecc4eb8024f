// Package cliflags holds the command-line flags the exporter and the
// shardlock tool share: how to reach Redis, with an environment variable
// standing in for each flag.
package cliflags

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redis is how to reach Redis: the -redis.* flags and -lock.prefix.
type Redis struct {
	Addr, User, Password, CAFile, Prefix string
	Cluster, TLS                         bool
}

// Register adds the flags to fs; addrHelp says what an empty -redis.addr
// means to the command.
func (r *Redis) Register(fs *flag.FlagSet, addrHelp string) {
	fs.StringVar(&r.Addr, "redis.addr", "", "Redis address, or comma-separated cluster seeds; "+addrHelp)
	fs.BoolVar(&r.Cluster, "redis.cluster", false, "the address is a cluster seed (implied by several addresses)")
	fs.StringVar(&r.User, "redis.user", "", "Redis ACL user")
	fs.StringVar(&r.Password, "redis.password", "", "Redis password (prefer the environment variable)")
	fs.BoolVar(&r.TLS, "redis.tls", false, "connect to Redis over TLS")
	fs.StringVar(&r.CAFile, "redis.tls-ca-file", "", "CA certificate file for Redis TLS")
	fs.StringVar(&r.Prefix, "lock.prefix", "shardlock:", "lock key prefix")
}

// Client makes the client the flags describe.
func (r *Redis) Client() (redis.UniversalClient, error) {
	var tlsCfg *tls.Config
	if r.TLS {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if r.CAFile != "" {
			pem, err := os.ReadFile(r.CAFile)
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("no certificate in %s", r.CAFile)
			}
			tlsCfg.RootCAs = pool
		}
	}
	addrs := strings.Split(r.Addr, ",")
	if r.Cluster || len(addrs) > 1 {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: r.User, Password: r.Password, TLSConfig: tlsCfg}), nil
	}
	return redis.NewClient(&redis.Options{Addr: addrs[0], Username: r.User, Password: r.Password, TLSConfig: tlsCfg}), nil
}

// EnvName is the environment variable that stands in for flag name under
// prefix: EnvName("SHARDLOCK_EXPORTER_", "redis.tls-ca-file") is
// SHARDLOCK_EXPORTER_REDIS_TLS_CA_FILE.
func EnvName(prefix, name string) string {
	return prefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(name))
}

// ApplyEnv sets every flag of fs whose environment variable is set; flags
// given on the command line (parsed after) win.
func ApplyEnv(fs *flag.FlagSet, prefix string) error {
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(EnvName(prefix, f.Name)); ok {
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: %w", EnvName(prefix, f.Name), v, err)
			}
		}
	})
	return envErr
}
