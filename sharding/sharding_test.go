package sharding

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestCRC16(t *testing.T) {
	// The check value of CRC16-XMODEM from the cluster specification.
	if got := CRC16("123456789"); got != 0x31C3 {
		t.Fatalf("CRC16(123456789) = %#x, want 0x31c3", got)
	}
}

func TestHashTag(t *testing.T) {
	tests := []struct {
		give    string
		wantTag string
		wantOK  bool
	}{
		// The examples of the cluster specification.
		{give: "{user1000}.following", wantTag: "user1000", wantOK: true},
		{give: "{user1000}.followers", wantTag: "user1000", wantOK: true},
		{give: "foo{}{bar}", wantTag: "foo{}{bar}", wantOK: false},
		{give: "foo{{bar}}zap", wantTag: "{bar", wantOK: true},
		{give: "foo{bar}{zap}", wantTag: "bar", wantOK: true},
		// Edge cases.
		{give: "", wantTag: "", wantOK: false},
		{give: "{}", wantTag: "{}", wantOK: false},
		{give: "{", wantTag: "{", wantOK: false},
		{give: "}", wantTag: "}", wantOK: false},
		{give: "}{a}", wantTag: "a", wantOK: true},
		{give: "a{b", wantTag: "a{b", wantOK: false},
		{give: "{a}", wantTag: "a", wantOK: true},
		{give: "x{ }", wantTag: " ", wantOK: true},
	}
	for _, tt := range tests {
		tag, ok := HashTag(tt.give)
		if tag != tt.wantTag || ok != tt.wantOK {
			t.Errorf("HashTag(%q) = %q, %v; want %q, %v", tt.give, tag, ok, tt.wantTag, tt.wantOK)
		}
	}
}

func TestSlot(t *testing.T) {
	tests := []struct {
		give string
		want int
	}{
		{give: "123456789", want: 0x31C3},
		{give: "foo", want: 12182},
		{give: "bar", want: 5061},
		{give: "hello", want: 866},
		{give: "", want: 0},
		{give: "{foo}bar", want: 12182},
		{give: "x{foo}y{bar}", want: 12182},
	}
	for _, tt := range tests {
		if got := Slot(tt.give); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.give, got, tt.want)
		}
	}
}

func TestLockKey(t *testing.T) {
	tests := []struct {
		prefix  string
		give    string
		want    string
		wantErr error
	}{
		{prefix: "shardlock:", give: "order:123", want: "shardlock:{order:123}"},
		{prefix: "shardlock:", give: "{order:123}:stock", want: "shardlock:{order:123}:stock"},
		{prefix: "", give: "a{b", want: "{a{b}"},
		{prefix: "p:", give: "}{x}", want: "p:}{x}"},
		{prefix: "shardlock:", give: "", wantErr: ErrBadResource},
		{prefix: "shardlock:", give: "a}b", wantErr: ErrBadResource},
		{prefix: "shardlock:", give: "a{}b", wantErr: ErrBadResource},
		{prefix: "shardlock:", give: "x" + FenceSuffix, wantErr: ErrBadResource},
		{prefix: "shardlock:", give: "{x}" + ChannelSuffix, wantErr: ErrBadResource},
		{prefix: "shardlock:", give: "y" + QueueSuffix, wantErr: ErrBadResource},
		{prefix: "shardlock:", give: "z" + ForcedSuffix, wantErr: ErrBadResource},
		{prefix: "lock{", give: "x", wantErr: ErrBadPrefix},
	}
	for _, tt := range tests {
		got, err := LockKey(tt.prefix, tt.give)
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("LockKey(%q, %q) = %q, %v; want %q, %v", tt.prefix, tt.give, got, err, tt.want, tt.wantErr)
		}
		// LockKeys makes the same key among others, or names the resource.
		keys, err := LockKeys(tt.prefix, []string{"{a}", tt.give, "b"})
		switch {
		case tt.wantErr != nil:
			named := tt.wantErr != ErrBadResource || strings.Contains(fmt.Sprint(err), fmt.Sprintf("%q", tt.give))
			if !errors.Is(err, tt.wantErr) || keys != nil || !named {
				t.Errorf("LockKeys(%q, %q) = %q, %v; want %v naming the resource", tt.prefix, tt.give, keys, err, tt.wantErr)
			}
		case err != nil || len(keys) != 3 || keys[0] != tt.prefix+"{a}" || keys[1] != tt.want || keys[2] != tt.prefix+"{b}":
			t.Errorf("LockKeys(%q, %q) = %q, %v; want %q in the middle", tt.prefix, tt.give, keys, err, tt.want)
		}
	}
}

// Every helper key must share the lock key's slot, whatever the resource.
func FuzzLockKeySlot(f *testing.F) {
	for _, s := range []string{"order:123", "{order:123}:stock", "a{b", "}{x}", "{{a}}", "x{y}z{w}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, resource string) {
		key, err := LockKey(DefaultPrefix, resource)
		keys, kerr := LockKeys(DefaultPrefix, []string{resource, "other"})
		if (kerr == nil) != (err == nil) || (err == nil && (keys[0] != key || keys[1] != DefaultPrefix+"{other}")) {
			t.Fatalf("LockKeys(%q, other) = %q, %v; LockKey = %q, %v", resource, keys, kerr, key, err)
		}
		if err != nil {
			return
		}
		if _, ok := HashTag(key); !ok {
			t.Fatalf("lock key %q of %q has no hash tag", key, resource)
		}
		if Slot(FenceKey(key)) != Slot(key) || Slot(ChannelName(key)) != Slot(key) || Slot(QueueKey(key)) != Slot(key) ||
			Slot(ForcedKey(key)) != Slot(key) || Slot(HandoverChannel(key, "{host}:1")) != Slot(key) {
			t.Fatalf("helper keys of %q leave slot %d", key, Slot(key))
		}
		if IsHelperKey(key) {
			t.Fatalf("lock key %q looks like a helper key", key)
		}
	})
}
