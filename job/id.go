package job

import (
	"crypto/rand"
	"encoding/binary"
	"time"
)

// base32 alphabet without padding, in ASCII order so that ids sort by time.
const idAlphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// NewID returns a new job id: 26 characters, sortable by creation time
// (to the millisecond), with 80 random bits.
func NewID() string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16)
	_, _ = rand.Read(b[6:])
	// 128 bits as 26 base32 digits, most significant first.
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = idAlphabet[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}
