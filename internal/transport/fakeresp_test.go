package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRESP is a tiny RESP2 server for tests that need replies no real
// server gives on cue. It keeps string keys and logs every command it
// reads, and it has traps, each sprung once:
//   - a command on a key that starts with "tryagain" is answered
//     TRYAGAIN the first time;
//   - a command on a key that starts with "cut" closes its connection
//     unanswered the first time (the
//     replies to the commands before it were written);
//   - a command on key "hold" is answered only after release is closed;
//     held is signalled when it is read;
//   - a command on key "tryhold" is answered TRYAGAIN the first time and
//     held as "hold" is the second time.
//
// SET k v [NX] and GET k do what Redis does; SET, GET, EVALSHA, MULTI and
// EXEC are logged; EVALSHA sha n k ... (its key
// is k, for the traps and the log) is answered 1; HELLO is refused
// (go-redis then speaks RESP2); anything else is answered OK.
type fakeRESP struct {
	tb      testing.TB
	ln      net.Listener
	held    chan struct{}
	release chan struct{}

	mu     sync.Mutex
	keys   map[string]string
	log    []string
	sprung map[string]bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func startFakeRESP(tb testing.TB) *fakeRESP {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &fakeRESP{tb: tb, ln: ln, held: make(chan struct{}, 1), release: make(chan struct{}),
		keys: map[string]string{}, sprung: map[string]bool{}, conns: map[net.Conn]struct{}{}}
	f.wg.Go(f.accept)
	tb.Cleanup(f.close)
	return f
}

func (f *fakeRESP) addr() string { return f.ln.Addr().String() }

func (f *fakeRESP) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Go(func() { f.serve(c) })
	}
}

func (f *fakeRESP) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.releaseHeld()
	f.wg.Wait()
}

// releaseHeld lets the held command be answered, and any later one at
// once. The test's goroutine calls it, once or more.
func (f *fakeRESP) releaseHeld() {
	select {
	case <-f.release:
	default:
		close(f.release)
	}
}

// spring reports whether trap has not been sprung yet, and springs it.
func (f *fakeRESP) spring(trap string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sprung[trap] {
		return false
	}
	f.sprung[trap] = true
	return true
}

// count returns how many times the server read the command "NAME key value".
func (f *fakeRESP) count(cmd string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, l := range f.log {
		if l == cmd {
			n++
		}
	}
	return n
}

func (f *fakeRESP) serve(c net.Conn) {
	defer func() {
		_ = c.Close()
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
	}()
	rd := bufio.NewReader(c)
	for {
		args, err := readArray(rd)
		if err != nil {
			return
		}
		reply, ok := f.answer(args)
		if !ok {
			return // the cut
		}
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

// answer returns the reply to args, or false to cut the connection.
func (f *fakeRESP) answer(args []string) (string, bool) {
	name := strings.ToUpper(args[0])
	key := ""
	if len(args) > 1 {
		key = args[1]
	}
	if name == "EVALSHA" && len(args) > 3 {
		key = args[3]
	}
	switch name {
	case "SET", "GET":
		f.mu.Lock()
		f.log = append(f.log, strings.Join(args[:min(len(args), 3)], " "))
		f.mu.Unlock()
	case "EVALSHA":
		f.mu.Lock()
		f.log = append(f.log, "evalsha "+key)
		f.mu.Unlock()
	case "MULTI", "EXEC":
		f.mu.Lock()
		f.log = append(f.log, strings.ToLower(name))
		f.mu.Unlock()
	}
	switch {
	case strings.HasPrefix(key, "tryagain") && f.spring(key):
		return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n", true
	case strings.HasPrefix(key, "cut") && f.spring(key):
		return "", false
	case key == "tryhold" && f.spring("tryhold"):
		return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n", true
	case (key == "hold" && f.spring("hold")) || (key == "tryhold" && f.spring("tryhold-again")):
		f.held <- struct{}{}
		<-f.release
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch name {
	case "HELLO":
		return "-ERR unknown command 'HELLO'\r\n", true
	case "PING":
		return "+PONG\r\n", true
	case "EVALSHA":
		return ":1\r\n", true
	case "GET":
		v, ok := f.keys[key]
		if !ok {
			return "$-1\r\n", true
		}
		return fmt.Sprintf("$%d\r\n%s\r\n", len(v), v), true
	case "SET":
		nx := false
		for _, a := range args[3:] {
			nx = nx || strings.EqualFold(a, "nx")
		}
		if _, ok := f.keys[key]; ok && nx {
			return "$-1\r\n", true
		}
		f.keys[key] = args[2]
		return "+OK\r\n", true
	}
	return "+OK\r\n", true
}

// readArray reads one command: an array of bulk strings.
func readArray(rd *bufio.Reader) ([]string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[0] != '*' {
		return nil, errors.New("fakeRESP: not an array: " + line)
	}
	n, err := strconv.Atoi(strings.TrimRight(line[1:], "\r\n"))
	if err != nil || n < 1 || n > 1024 {
		return nil, errors.New("fakeRESP: bad array length: " + line)
	}
	args := make([]string, n)
	for i := range args {
		line, err := rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if len(line) < 3 || line[0] != '$' {
			return nil, errors.New("fakeRESP: not a bulk string: " + line)
		}
		size, err := strconv.Atoi(strings.TrimRight(line[1:], "\r\n"))
		if err != nil || size < 0 || size > 1<<20 {
			return nil, errors.New("fakeRESP: bad bulk length: " + line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

// testCtx returns a context that ends with the test, or after 30 s.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
