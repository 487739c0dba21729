package main

import (
	"context"
	"flag"
	"net/http"
	"time"
)

func init() {
	commands = append(commands, &command{
		name: "probe", args: "URL",
		help: "Exit 0 if URL answers 2xx within 3 seconds: a health check for images\n" +
			"that have no shell or HTTP client (docker compose healthcheck).",
		example: "fleetctl probe http://127.0.0.1:9090/readyz",
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if len(args) != 1 {
				return exit(exitUsage, "probe needs one URL")
			}
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
			if err != nil {
				return exit(exitUsage, "%v", err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return exit(exitFleet, "%v", err)
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				return exit(exitFleet, "%s: %s", args[0], resp.Status)
			}
			return nil
		},
	})
}
