/* chat_template.c: not written yet */
