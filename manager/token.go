package manager

import (
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardlock/shardlock/sharding"
)

// Token format, version 1:
//
//	sl1.<acquired-unix-ms>.<random>.<owner>
//
// <acquired-unix-ms> is the acquisition time in Unix milliseconds (decimal),
// <random> is 16 bytes (128 bits) from crypto/rand in unpadded base64url (22
// characters), and <owner> is the manager's owner id (it may itself contain
// dots: it is everything after the third dot). The random part is what makes
// a token a secret; shardlock never logs it whole.
const (
	TokenVersion = "sl1"
	randomBytes  = 16
	randomChars  = 22 // base64.RawURLEncoding.EncodedLen(randomBytes)
)

// TokenInfo is what a token says about its lock. The random part is not
// exposed.
type TokenInfo struct {
	Version    string
	AcquiredAt time.Time
	Owner      string
}

// newToken makes a version-1 token for owner, stamped with now.
// randBuf holds crypto/rand output for tokens, read 1 KiB at a time: one
// read per 64 tokens instead of one per token.
type randBuf struct {
	b   [1024]byte
	off int
}

var randPool = sync.Pool{New: func() any { return &randBuf{off: 1024} }}

// random16 fills b with 16 bytes from crypto/rand. Each byte is used once.
func random16(b *[randomBytes]byte) {
	rb := randPool.Get().(*randBuf)
	if rb.off+randomBytes > len(rb.b) {
		_, _ = rand.Read(rb.b[:]) // crypto/rand.Read never returns an error (Go 1.24+).
		rb.off = 0
	}
	copy(b[:], rb.b[rb.off:rb.off+randomBytes])
	clear(rb.b[rb.off : rb.off+randomBytes])
	rb.off += randomBytes
	randPool.Put(rb)
}

func newToken(owner string, now time.Time) string {
	var b [randomBytes]byte
	random16(&b)
	var msBuf [20]byte
	ms := strconv.AppendInt(msBuf[:0], now.UnixMilli(), 10)
	var enc [randomChars]byte
	base64.RawURLEncoding.Encode(enc[:], b[:])
	var sb strings.Builder // one allocation: the token itself
	sb.Grow(len(TokenVersion) + 3 + len(ms) + randomChars + len(owner))
	sb.WriteString(TokenVersion)
	sb.WriteByte('.')
	sb.Write(ms)
	sb.WriteByte('.')
	sb.Write(enc[:])
	sb.WriteByte('.')
	sb.WriteString(owner)
	return sb.String()
}

// ParseToken reads a token made by shardlock (the value stored at a lock
// key, with or without one sharding.QueuedMark). It accepts exactly what shardlock
// writes: the version, a decimal time without sign or leading zeros, 22
// characters of canonical base64url, and an owner id as WithOwner accepts
// it. It returns ErrBadToken for anything else. The exporter uses it to
// find locks held too long.
func ParseToken(s string) (TokenInfo, error) {
	s = strings.TrimSuffix(s, sharding.QueuedMark)
	parts := strings.SplitN(s, ".", 4)
	if len(parts) != 4 || parts[0] != TokenVersion || len(parts[2]) != randomChars || !decimal(parts[1]) {
		return TokenInfo{}, ErrBadToken
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return TokenInfo{}, ErrBadToken
	}
	if _, err := base64.RawURLEncoding.Strict().DecodeString(parts[2]); err != nil {
		return TokenInfo{}, ErrBadToken
	}
	if validateOwner(parts[3]) != nil {
		return TokenInfo{}, ErrBadToken
	}
	return TokenInfo{Version: parts[0], AcquiredAt: time.UnixMilli(ms), Owner: parts[3]}, nil
}

// tokenMillis reads the issue time (Unix ms) of token tok, as ParseToken's
// AcquiredAt, without checking the rest of it and without allocating (the
// in-process hand-over reads it on a contended release).
func tokenMillis(tok string) (int64, bool) {
	_, rest, ok := strings.Cut(tok, ".")
	if !ok {
		return 0, false
	}
	ms, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	return n, err == nil
}

// decimal reports whether s is a non-negative decimal number as
// strconv.FormatInt writes it: digits only, no leading zero but for "0".
func decimal(s string) bool {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// redactToken returns what may be logged of a token: everything but the
// random part, of which only the first 4 characters (24 of 128 bits) are
// kept, enough to tell two tokens apart in a log.
func redactToken(s string) string {
	parts := strings.SplitN(s, ".", 4)
	if len(parts) != 4 || len(parts[2]) < 4 {
		return "<malformed>"
	}
	return parts[0] + "." + parts[1] + "." + parts[2][:4] + "…." + parts[3]
}
