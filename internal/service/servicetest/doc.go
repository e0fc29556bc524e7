// Package servicetest gives tests that run the service's parts the
// service's own configuration: config.Defaults (the defaults of the
// environment variables, read from their tags), with the servers, topic
// and group of the test and the timings that make a test fast, mapped to
// each part by the functions the service uses (service.PipelineConfig,
// service.SinkConfig), so that no test restates the settings.
package servicetest
