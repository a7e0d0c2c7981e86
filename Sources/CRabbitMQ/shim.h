#ifndef C_RABBITMQ_SHIM_H
#define C_RABBITMQ_SHIM_H
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <amqp_ssl_socket.h>

// amqp_login is variadic (its SASL arguments), which Swift cannot call: this fixes it to PLAIN, announcing the
// client capabilities "connection.blocked" (without it RabbitMQ never tells the client that a memory or disk alarm
// blocks its publishes, and a blocked publisher cannot tell an alarm from a dead link) and "consumer_cancel_notify"
// (without it a consumer whose queue is deleted just stops receiving; AMQPConnection reports the broker's
// basic.cancel as a lost connection, so that the owner reconnects and consumes afresh).
static inline amqp_rpc_reply_t CRabbitMQ_login_plain_with_capabilities(amqp_connection_state_t state, const char *vhost,
                                                                       int channel_max, int frame_max, int heartbeat,
                                                                       const char *user, const char *password) {
    amqp_table_entry_t capabilities[2];
    capabilities[0].key = amqp_cstring_bytes("connection.blocked");
    capabilities[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
    capabilities[0].value.value.boolean = 1;
    capabilities[1].key = amqp_cstring_bytes("consumer_cancel_notify");
    capabilities[1].value.kind = AMQP_FIELD_KIND_BOOLEAN;
    capabilities[1].value.value.boolean = 1;
    amqp_table_entry_t properties[2];
    properties[0].key = amqp_cstring_bytes("capabilities");
    properties[0].value.kind = AMQP_FIELD_KIND_TABLE;
    properties[0].value.value.table.num_entries = 2;
    properties[0].value.value.table.entries = capabilities;
    properties[1].key = amqp_cstring_bytes("product");
    properties[1].value.kind = AMQP_FIELD_KIND_UTF8;
    properties[1].value.value.bytes = amqp_cstring_bytes("apns-worker");
    amqp_table_t table = {2, properties};
    return amqp_login_with_properties(state, vhost, channel_max, frame_max, heartbeat, &table, AMQP_SASL_METHOD_PLAIN,
                                      user, password);
}
#endif
