// Command apns-worker-example shows the services around apns-worker in Go, with github.com/rabbitmq/amqp091-go
// (Debian: golang-github-rabbitmq-amqp091-go-dev). Three subcommands, each one thing a backend does
// (docs/contract.md):
//
//	publish-job -user alice -token 740f...78ad -alert "Your order shipped"   a job, confirmed, then its summary
//	dead-tokens -file dead.txt -count 1                                       a token-cleanup consumer
//	register -user alice -token 740f...78ad -timezone Europe/Paris            a registration event, confirmed
//
// AMQP_URL, PUSH_JOBS_QUEUE, PUSH_DEAD_TOKENS_QUEUE and PUSH_REGISTRATIONS_QUEUE are read as apns-worker reads them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func setting(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// confirmedChannel opens a channel in confirm mode, with mandatory publishes handed back on returns.
func confirmedChannel() (*amqp.Connection, *amqp.Channel, chan amqp.Return, error) {
	connection, err := amqp.Dial(setting("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"))
	if err != nil {
		return nil, nil, nil, err
	}
	channel, err := connection.Channel()
	if err == nil {
		err = channel.Confirm(false)
	}
	if err != nil {
		connection.Close()
		return nil, nil, nil, err
	}
	returns := channel.NotifyReturn(make(chan amqp.Return, 1))
	return connection, channel, returns, nil
}

// publishJSON publishes document to queue, persistent and mandatory, and waits for the broker's confirm: an error if
// the broker refused it or had no queue for it.
func publishJSON(channel *amqp.Channel, returns chan amqp.Return, queue string, document any, message amqp.Publishing) error {
	body, err := json.Marshal(document)
	if err != nil {
		return err
	}
	message.Body, message.ContentType, message.DeliveryMode = body, "application/json", amqp.Persistent
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	confirmation, err := channel.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, message)
	if err != nil {
		return err
	}
	acked := confirmation.Wait()
	select {
	case returned := <-returns:
		return fmt.Errorf("no queue %q took it: %s", queue, returned.ReplyText)
	default:
	}
	if !acked {
		return errors.New("the broker refused it")
	}
	return nil
}

func publishJob(args []string) error {
	flags := flag.NewFlagSet("publish-job", flag.ExitOnError)
	var users, tokens list
	flags.Var(&users, "user", "a user whose cached tokens the job reaches (repeatable)")
	flags.Var(&tokens, "token", "a device token, hex (repeatable)")
	alert := flags.String("alert", "", "the alert's text")
	id := flags.String("id", fmt.Sprintf("example-%d", time.Now().UnixNano()), "the job's id")
	timeout := flags.Float64("timeout", 30, "seconds to wait for the summary")
	flags.Parse(args)
	connection, channel, returns, err := confirmedChannel()
	if err != nil {
		return err
	}
	defer connection.Close()
	replies, err := channel.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	job := map[string]any{"id": *id, "users": []string(users), "tokens": []string(tokens),
		"payload": map[string]any{"aps": map[string]any{"alert": *alert}}}
	queue := setting("PUSH_JOBS_QUEUE", "push.jobs")
	err = publishJSON(channel, returns, queue, job, amqp.Publishing{ReplyTo: replies.Name, CorrelationId: *id, MessageId: *id})
	if err != nil {
		return fmt.Errorf("publishing the job to %s: %w", queue, err)
	}
	deliveries, err := channel.Consume(replies.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}
	deadline := time.After(time.Duration(*timeout * float64(time.Second)))
	for {
		select {
		case delivery := <-deliveries:
			var summary struct {
				JobID         string `json:"job_id"`
				Notifications *int   `json:"notifications"`
				Delivered     *int   `json:"delivered"`
				Dead          *int   `json:"dead"`
				Failed        *int   `json:"failed"`
			}
			if err := json.Unmarshal(delivery.Body, &summary); err != nil {
				return fmt.Errorf("a summary that is not JSON: %w", err)
			}
			if delivery.CorrelationId != *id || summary.JobID != *id {
				continue
			}
			if summary.Notifications == nil || summary.Delivered == nil || summary.Dead == nil || summary.Failed == nil {
				return fmt.Errorf("a summary without its counts: %s", delivery.Body)
			}
			fmt.Println(string(delivery.Body))
			return nil
		case <-deadline:
			return fmt.Errorf("no summary within %g s", *timeout)
		}
	}
}

func deadTokens(args []string) error {
	flags := flag.NewFlagSet("dead-tokens", flag.ExitOnError)
	file := flags.String("file", "dead-tokens.txt", "where the dead tokens are written, a line each")
	count := flags.Int("count", 0, "stop after this many events (0: never)")
	timeout := flags.Float64("timeout", 0, "seconds to give up after without an event (0: never)")
	flags.Parse(args)
	output, err := os.OpenFile(*file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer output.Close()
	connection, channel, _, err := confirmedChannel()
	if err != nil {
		return err
	}
	defer connection.Close()
	channel.Qos(100, 0, false)
	// The queue is the workers' (they declare it, durable): used as it is.
	deliveries, err := channel.Consume(setting("PUSH_DEAD_TOKENS_QUEUE", "push.dead-tokens"), "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	stored := 0
	for {
		var wait <-chan time.Time
		if *timeout > 0 {
			wait = time.After(time.Duration(*timeout * float64(time.Second)))
		}
		select {
		case delivery := <-deliveries:
			var event struct {
				Token       string  `json:"token"`
				User        *string `json:"user"`
				Topic       string  `json:"topic"`
				Environment string  `json:"environment"`
				Status      int     `json:"status"`
				Timestamp   *int64  `json:"timestamp"`
			}
			if err := json.Unmarshal(delivery.Body, &event); err != nil || event.Token == "" || event.Topic == "" {
				// Not an event this consumer understands: set aside, not requeued (it would come back for ever).
				delivery.Reject(false)
				continue
			}
			user := ""
			if event.User != nil {
				user = *event.User
			}
			// Written and synced before the acknowledgement: a crash in between gets the event again.
			if _, err := fmt.Fprintf(output, "%s %s %s %s %d\n", event.Token, user, event.Topic, event.Environment, event.Status); err != nil {
				return err
			}
			if err := output.Sync(); err != nil {
				return err
			}
			delivery.Ack(false)
			stored++
			fmt.Fprintf(os.Stderr, "stored dead token %s... of user %s\n", event.Token[:8], user)
			if *count > 0 && stored >= *count {
				return nil
			}
		case <-wait:
			return fmt.Errorf("no dead-token event within %g s", *timeout)
		}
	}
}

func register(args []string) error {
	flags := flag.NewFlagSet("register", flag.ExitOnError)
	user := flags.String("user", "", "the user")
	token := flags.String("token", "", "the device token, hex")
	environment := flags.String("environment", "production", "production or sandbox")
	timezone := flags.String("timezone", "", "the user's IANA time zone, for jobs with a local_window")
	flags.Parse(args)
	event := map[string]any{"user": *user, "token": *token, "environment": *environment,
		"timestamp": time.Now().UnixMilli(), "action": "register", "device": map[string]any{"model": "example"}}
	if *timezone != "" {
		event["timezone"] = *timezone
	}
	connection, channel, returns, err := confirmedChannel()
	if err != nil {
		return err
	}
	defer connection.Close()
	queue := setting("PUSH_REGISTRATIONS_QUEUE", "push.registrations")
	if err := publishJSON(channel, returns, queue, event, amqp.Publishing{}); err != nil {
		return fmt.Errorf("publishing the registration to %s: %w", queue, err)
	}
	fmt.Fprintf(os.Stderr, "registered %s... for %s\n", (*token)[:8], *user)
	return nil
}

func main() {
	commands := map[string]func([]string) error{"publish-job": publishJob, "dead-tokens": deadTokens, "register": register}
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: apns-worker-example publish-job|dead-tokens|register [flags]")
		os.Exit(2)
	}
	if err := commands[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "apns-worker-example:", err)
		os.Exit(1)
	}
}
