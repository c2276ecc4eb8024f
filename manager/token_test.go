package manager

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardlock/shardlock/sharding"
)

func TestTokenRoundTrip(t *testing.T) {
	now := time.UnixMilli(1796000000123)
	tok := newToken("host.example:42", now)
	info, err := ParseToken(tok)
	if err != nil {
		t.Fatalf("ParseToken(%q): %v", tok, err)
	}
	if info.Version != TokenVersion || !info.AcquiredAt.Equal(now) || info.Owner != "host.example:42" {
		t.Fatalf("ParseToken = %+v", info)
	}
	if other := newToken("host.example:42", now); other == tok {
		t.Fatal("two tokens with the same owner and time are equal")
	}
}

// A lock key's value may carry the queued mark after the token.
func TestParseTokenAcceptsTimeZero(t *testing.T) {
	tok := newToken("svc", time.UnixMilli(0))
	if _, err := ParseToken(tok); err != nil {
		t.Fatalf("ParseToken(%q): %v", tok, err)
	}
}

func TestParseTokenWithQueuedMark(t *testing.T) {
	now := time.UnixMilli(1700000000123)
	tok := newToken("svc-1", now)
	info, err := ParseToken(tok + sharding.QueuedMark)
	if err != nil || info.Owner != "svc-1" || !info.AcquiredAt.Equal(now) {
		t.Fatalf("%+v, %v", info, err)
	}
}

func TestParseTokenRejects(t *testing.T) {
	good := newToken("o", time.UnixMilli(1))
	parts := strings.SplitN(good, ".", 4)
	tests := []string{
		"", "sl1", "sl1.1.x.o", "sl2." + strings.Join(parts[1:], "."),
		"sl1.-5." + parts[2] + ".o", "sl1.abc." + parts[2] + ".o",
		"sl1.1." + strings.Repeat("!", randomChars) + ".o",
		"sl1.1." + parts[2] + "x.o",
		// Exactly what shardlock writes, nothing else.
		"sl1.1." + parts[2] + ".",                            // empty owner
		"sl1.1." + parts[2] + ".\xff",                        // owner not UTF-8
		"sl1.1." + parts[2] + ".a\nb",                        // owner not printable
		"sl1.+1." + parts[2] + ".o",                          // sign
		"sl1.01." + parts[2] + ".o",                          // leading zero
		"sl1..x" + parts[2][1:] + ".o",                       // empty time
		"sl1.99999999999999999999." + parts[2] + ".o",        // past int64
		good + sharding.QueuedMark + sharding.QueuedMark,     // double mark
		"sl1.1." + parts[2][:21] + "B.o",                     // non-canonical base64 (stray low bits)
		"sl1.1." + parts[2] + "." + strings.Repeat("o", 257), // owner too long
	}
	for _, give := range tests {
		if _, err := ParseToken(give); !errors.Is(err, ErrBadToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrBadToken", give, err)
		}
	}
}

func TestRedactTokenHidesRandom(t *testing.T) {
	tok := newToken("me", time.Now())
	random := strings.SplitN(tok, ".", 4)[2]
	red := redactToken(tok)
	if strings.Contains(red, random) || strings.Contains(red, random[4:]) {
		t.Fatalf("redacted %q still holds the random part", red)
	}
	if !strings.HasPrefix(red, "sl1.") || !strings.HasSuffix(red, ".me") {
		t.Fatalf("redacted %q lost the non-secret parts", red)
	}
}

// Tokens drawn from the buffered crypto/rand reader never repeat.
func TestTokensDistinct(t *testing.T) {
	seen := make(map[string]bool, 20000)
	now := time.Now()
	for range 20000 {
		tok := newToken("o", now)
		if seen[tok] {
			t.Fatalf("token %q drawn twice", redactToken(tok))
		}
		seen[tok] = true
	}
}
