package manager

import (
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
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
func newToken(owner string, now time.Time) string {
	var b [randomBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error (Go 1.24+).
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
// key). It returns ErrBadToken for anything else. The exporter uses it to
// find locks held too long.
func ParseToken(s string) (TokenInfo, error) {
	parts := strings.SplitN(s, ".", 4)
	if len(parts) != 4 || parts[0] != TokenVersion || len(parts[2]) != randomChars {
		return TokenInfo{}, ErrBadToken
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || ms < 0 {
		return TokenInfo{}, ErrBadToken
	}
	if _, err := base64.RawURLEncoding.DecodeString(parts[2]); err != nil {
		return TokenInfo{}, ErrBadToken
	}
	return TokenInfo{Version: parts[0], AcquiredAt: time.UnixMilli(ms), Owner: parts[3]}, nil
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
