package sharding

import "strings"

// SlotCount is the number of hash slots in a Redis Cluster.
const SlotCount = 16384

// crcTable is the CRC16-XMODEM (polynomial 0x1021, initial value 0) table.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// CRC16 returns the CRC16-XMODEM checksum of s, the checksum Redis Cluster
// uses for key slots. CRC16("123456789") is 0x31C3.
func CRC16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

// HashTag returns the part of key that Redis Cluster hashes: the bytes
// between the first '{' and the first '}' after it when there is at least one
// byte between them, and the whole key otherwise. ok reports whether key has
// such a non-empty tag.
func HashTag(key string) (tag string, ok bool) {
	i := strings.IndexByte(key, '{') // on every lock call: IndexByte, not a loop
	if i < 0 {
		return key, false
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 { // no '}', or nothing between the braces
		return key, false
	}
	return key[i+1 : i+1+j], true
}

// Slot returns the Redis Cluster hash slot of key, in [0, SlotCount).
func Slot(key string) int {
	tag, _ := HashTag(key)
	return int(CRC16(tag) % SlotCount)
}
