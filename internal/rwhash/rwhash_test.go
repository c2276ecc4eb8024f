package rwhash

import (
	"strconv"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	later, earlier := strconv.FormatInt(now.UnixMilli()+1000, 10), strconv.FormatInt(now.UnixMilli()-1, 10)
	if _, ok := Parse(map[string]string{"a": "b"}, now); ok {
		t.Fatal("a hash without the marker parsed as a read-write lock")
	}
	s, ok := Parse(map[string]string{"sl": Magic, "w": "sl1.1.x.w", "we": earlier, "r:sl1.1.x.a": later, "r:sl1.1.x.b": earlier,
		"n": "2", "f": "42", "q": "1:2:r:sl1.1.x.c\n1:2:1:sl1.1.x.d"}, now)
	if !ok || s.Writer != "" || len(s.Readers) != 1 || s.Readers[0] != "sl1.1.x.a" || s.Fence != 42 || len(s.Queue) != 2 || !s.Held() {
		t.Fatalf("parsed %+v, %v", s, ok)
	}
	s, _ = Parse(map[string]string{"sl": Magic, "w": "sl1.1.x.w", "we": later}, now)
	if s.Writer != "sl1.1.x.w" || !s.Held() {
		t.Fatalf("live writer: %+v", s)
	}
	if s, _ := Parse(map[string]string{"sl": Magic, "o": "x=1"}, now); s.Held() {
		t.Fatalf("nobody holds it: %+v", s)
	}
}
