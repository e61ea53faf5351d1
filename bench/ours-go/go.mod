module scalabletopics.local/bench/ours-go

go 1.23.0

require (
	github.com/gorilla/websocket v1.5.3
	github.com/spaolacci/murmur3 v1.1.0
)
